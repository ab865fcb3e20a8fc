"""Gradients of every backward mode against independent references.

References: ``torch.autograd.gradcheck`` (finite differences of the layer itself), central finite
differences of a fixed point computed by a plain loop written here, and hand-written
"detach, then k steps with gradient" computations.
"""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F
from helpers.registry_names import usable_names
from torch import Tensor

import implicit_ham as ih

DT = torch.float64
# every built-in linear solver of a general system (CG needs a symmetric positive-definite one)
LINEAR_SOLVER_NAMES = usable_names(
    ih.plugins.LINEAR_SOLVERS, where=lambda cls: not cls.requires_spd
)
TIGHT_FORWARD = ih.FixedPointIteration(max_steps=200, tol=1e-13)


# --- a two-tensor state map used only in this file: u (B, 3), w (B, 2, 2) ---------------------


def coupled_map(
    state: tuple[Tensor, Tensor], x: Tensor, P: Tensor, R: Tensor, Q: Tensor, S: Tensor
) -> tuple[Tensor, Tensor]:
    """``u' = sigmoid(u P + vec(w) Q + x)``, ``w' = softplus(u R - vec(w) S) / 2`` (2x2 per sample).

    Shapes: u, x (B, 3); w (B, 2, 2); P (3, 3); Q (4, 3); R (3, 4); S (4, 4).
    """
    u, w = state
    w_flat = w.reshape(w.shape[0], 4)
    u_next = torch.sigmoid(u @ P + w_flat @ Q + x)
    w_next = 0.5 * F.softplus(u @ R - w_flat @ S)
    return u_next, w_next.reshape(w.shape)


def coupled_inputs(batch: int, seed: int = 1) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, ...]]:
    """(z0, (x, P, R, Q, S)); x, P, R require grad, Q and S are constants."""
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape: int, scale: float = 1.0) -> Tensor:
        return scale * torch.randn(*shape, generator=gen, dtype=DT)

    x = rand(batch, 3).requires_grad_()
    P = rand(3, 3, scale=0.5).requires_grad_()
    R = rand(3, 4, scale=0.3).requires_grad_()
    Q, S = rand(4, 3, scale=0.5), rand(4, 4, scale=0.3)
    z0 = (torch.zeros(batch, 3, dtype=DT), torch.zeros(batch, 2, 2, dtype=DT))
    return z0, (x, P, R, Q, S)


def coupled_loss(state: tuple[Tensor, Tensor]) -> Tensor:
    """A nonlinear readout of both state tensors."""
    u, w = state
    cu = torch.linspace(-1.0, 2.0, u[0].numel(), dtype=DT)
    return (u * cu).sum() + (w**2).sum()


def fixed_point_by_loop(z0: tuple[Tensor, Tensor], args: tuple[Tensor, ...], steps: int = 200):
    """The fixed point by plain iteration, written here independently of the library."""
    z = z0
    for _ in range(steps):
        z = coupled_map(z, *args)
    return z


def central_differences(z0, args: tuple[Tensor, ...], n_params: int, eps: float = 1e-5) -> Tensor:
    """d loss(z*) / d(first ``n_params`` args), every entry by central differences, flattened."""
    values = [a.detach().clone() for a in args]
    grads = []
    with torch.no_grad():
        for p in values[:n_params]:
            flat = p.view(-1)
            for i in range(flat.numel()):
                original = float(flat[i])
                flat[i] = original + eps
                up = coupled_loss(fixed_point_by_loop(z0, tuple(values)))
                flat[i] = original - eps
                down = coupled_loss(fixed_point_by_loop(z0, tuple(values)))
                flat[i] = original
                grads.append((up - down) / (2 * eps))
    return torch.stack(grads)


def layer_gradient(
    z0, args, solver: ih.plugins.FixedPointSolver, adjoint: ih.plugins.Adjoint
) -> Tensor:
    """d loss / d(x, P, R) through ``ih.fixed_point``, flattened."""
    sol = ih.fixed_point(coupled_map, z0, *args, solver=solver, adjoint=adjoint)
    grads = torch.autograd.grad(coupled_loss(sol.value), args[:3])
    return torch.cat([g.reshape(-1) for g in grads])


def relative_error(a: Tensor, ref: Tensor) -> float:
    return float(torch.linalg.vector_norm(a - ref) / torch.linalg.vector_norm(ref))


# --- gradcheck ----------------------------------------------------------------------------------


def test_unroll_passes_gradcheck(tanh_problem) -> None:
    p = tanh_problem(batch=2, width=4)
    solver = ih.FixedPointIteration(max_steps=8)

    def layer(x: Tensor, W: Tensor) -> Tensor:
        return ih.fixed_point(p.f, p.z0, x, W, solver=solver, adjoint=ih.Unroll()).value

    assert torch.autograd.gradcheck(layer, p.args)


@pytest.mark.parametrize("linear_solver", LINEAR_SOLVER_NAMES)
def test_implicit_passes_gradcheck_for_every_linear_solver(tanh_problem, linear_solver) -> None:
    p = tanh_problem(batch=2, width=4)
    adjoint = ih.Implicit(linear_solver=linear_solver, max_steps=200, tol=1e-12)

    def layer(x: Tensor, W: Tensor) -> Tensor:
        return ih.fixed_point(p.f, p.z0, x, W, solver=TIGHT_FORWARD, adjoint=adjoint).value

    assert torch.autograd.gradcheck(layer, p.args)


@pytest.mark.parametrize("batch", [1, 2])
def test_implicit_passes_gradcheck_on_a_tuple_state(batch) -> None:
    z0, args = coupled_inputs(batch)
    adjoint = ih.Implicit(linear_solver="gmres", tol=1e-12)

    def layer(x: Tensor, P: Tensor, R: Tensor) -> tuple[Tensor, ...]:
        sol = ih.fixed_point(
            coupled_map, z0, x, P, R, *args[3:], solver=TIGHT_FORWARD, adjoint=adjoint
        )
        return sol.value

    assert torch.autograd.gradcheck(layer, args[:3])


# --- Implicit = converged Unroll = finite differences ---------------------------------------------


@pytest.mark.parametrize("batch", [1, 3])
def test_implicit_and_converged_unroll_match_finite_differences(batch) -> None:
    z0, args = coupled_inputs(batch)
    reference = central_differences(z0, args, n_params=3)

    implicit = layer_gradient(z0, args, TIGHT_FORWARD, ih.Implicit(tol=1e-12))
    unrolled = layer_gradient(z0, args, ih.FixedPointIteration(max_steps=80), ih.Unroll())

    assert relative_error(implicit, reference) <= 1e-6
    assert relative_error(unrolled, reference) <= 1e-6
    assert relative_error(implicit, unrolled) <= 1e-6


# --- through-iteration modes = a hand-written detach-then-k-steps computation ---------------------


def detach_then_steps(z0, args, total: int, k: int, tau: float = 1.0) -> tuple[Tensor, Tensor]:
    """``total - k`` steps without gradient, detach, then k steps ``z <- tau f(z) + (1-tau) z``."""
    z = z0
    with torch.no_grad():
        for _ in range(total - k):
            z = coupled_map(z, *args)
    z = tuple(t.detach() for t in z)
    for _ in range(k):
        fz = coupled_map(z, *args)
        z = fz if tau == 1.0 else tuple(tau * a + (1 - tau) * b for a, b in zip(fz, z, strict=True))
    return z


@pytest.mark.parametrize(
    ("adjoint", "k", "tau"),
    [
        (ih.OneStep(), 1, 1.0),
        (ih.Truncated(1), 1, 1.0),
        (ih.Truncated(3), 3, 1.0),
        (ih.Truncated(12), 12, 1.0),
    ],
)
@pytest.mark.parametrize("batch", [1, 3])
def test_through_iteration_modes_equal_detach_then_k_steps(adjoint, k, tau, batch) -> None:
    total = 12
    z0, args = coupled_inputs(batch)
    expected_value = detach_then_steps(z0, args, total, k, tau)
    expected = torch.autograd.grad(coupled_loss(expected_value), args[:3])
    expected = torch.cat([g.reshape(-1) for g in expected])

    solver = ih.FixedPointIteration(max_steps=total)
    sol = ih.fixed_point(coupled_map, z0, *args, solver=solver, adjoint=adjoint)
    got = torch.autograd.grad(coupled_loss(sol.value), args[:3])
    got = torch.cat([g.reshape(-1) for g in got])

    if tau == 1.0:  # the forward value is the plain K-step iterate
        for a, b in zip(sol.value, expected_value, strict=True):
            assert torch.equal(a, b)
    torch.testing.assert_close(got, expected, rtol=1e-13, atol=0)


def phantom_reference(z0, args, total: int, k: int, tau: float) -> tuple[Tensor, Tensor]:
    """(value, gradient) of the phantom gradient written from its definition: ``total`` plain
    steps without gradient give z*; k damped steps from z* carry the gradient, which is the
    vector-Jacobian product of the loss's gradient at z* (not at the damped iterate)."""
    z = z0
    with torch.no_grad():
        for _ in range(total):
            z = coupled_map(z, *args)
    z_star = tuple(t.detach().requires_grad_() for t in z)
    v = torch.autograd.grad(coupled_loss(z_star), z_star)
    p = tuple(t.detach() for t in z)
    for _ in range(k):
        fz = coupled_map(p, *args)
        p = tuple(tau * a + (1 - tau) * b for a, b in zip(fz, p, strict=True))
    grad = torch.autograd.grad(p, args[:3], v)
    return z, torch.cat([g.reshape(-1) for g in grad])


@pytest.mark.parametrize(("k", "tau"), [(1, 1.0), (3, 1.0), (4, 0.5), (2, 0.2)])
@pytest.mark.parametrize("batch", [1, 3])
def test_phantom_keeps_the_solvers_value_and_takes_damped_steps_from_it(k, tau, batch) -> None:
    total = 12
    z0, args = coupled_inputs(batch)
    expected_value, expected = phantom_reference(z0, args, total, k, tau)

    solver = ih.FixedPointIteration(max_steps=total)
    sol = ih.fixed_point(coupled_map, z0, *args, solver=solver, adjoint=ih.Phantom(k=k, tau=tau))
    got = torch.autograd.grad(coupled_loss(sol.value), args[:3])

    for a, b in zip(sol.value, expected_value, strict=True):
        assert torch.equal(a, b)
    got = torch.cat([g.reshape(-1) for g in got])
    torch.testing.assert_close(got, expected, rtol=1e-13, atol=0)


def test_truncated_with_a_tolerance_replays_the_last_steps_before_the_stop() -> None:
    """Per-sample stopping: each sample's value is k steps (with gradient) from its own iterate
    k steps before its own stop; the reference solves each sample alone here."""
    tol, k, batch = 1e-8, 2, 3
    z0, args = coupled_inputs(batch=batch)
    x, rest = args[0], args[1:]
    ends, counts = [], []
    for i in range(batch):
        trajectory = [tuple(t[i : i + 1] for t in z0)]
        with torch.no_grad():
            while True:
                trajectory.append(coupled_map(trajectory[-1], x[i : i + 1], *rest))
                new, old = trajectory[-1], trajectory[-2]
                diff = torch.cat([(a - b).reshape(1, -1) for a, b in zip(new, old, strict=True)], 1)
                norm = torch.cat([a.reshape(1, -1) for a in new], 1)
                if float(diff.norm() / norm.norm()) <= tol:
                    break
        z = tuple(t.detach() for t in trajectory[-1 - k])
        for _ in range(k):
            z = coupled_map(z, x[i : i + 1], *rest)
        ends.append(z)
        counts.append(len(trajectory) - 1)
    z = tuple(torch.cat(parts) for parts in zip(*ends, strict=True))
    expected = torch.cat([g.reshape(-1) for g in torch.autograd.grad(coupled_loss(z), args[:3])])

    solver = ih.FixedPointIteration(max_steps=100, tol=tol)
    sol = ih.fixed_point(coupled_map, z0, *args, solver=solver, adjoint=ih.Truncated(k))
    got = torch.cat([g.reshape(-1) for g in torch.autograd.grad(coupled_loss(sol.value), args[:3])])

    assert sol.stats.steps == max(counts)
    assert sol.stats.steps_per_sample().tolist() == counts
    torch.testing.assert_close(got, expected, rtol=1e-13, atol=0)


# --- phantom gradients and the Neumann series ----------------------------------------------------


def tanh_gradient(p, solver: ih.plugins.FixedPointSolver, adjoint: ih.plugins.Adjoint) -> Tensor:
    """d(sum(weights * z*)) / d(x, W) for the conftest tanh problem, flattened."""
    sol = ih.fixed_point(p.f, p.z0, *p.args, solver=solver, adjoint=adjoint)
    weights = torch.linspace(-1.0, 1.0, sol.value.numel(), dtype=DT).reshape(sol.value.shape)
    grads = torch.autograd.grad((sol.value * weights).sum(), p.args)
    return torch.cat([g.reshape(-1) for g in grads])


def test_phantom_cosine_similarity_to_implicit_rises_with_k(tanh_problem) -> None:
    p = tanh_problem(batch=3, width=5)
    exact = tanh_gradient(p, TIGHT_FORWARD, ih.Implicit(linear_solver="dense", tol=1e-12))
    cosines = [
        float(F.cosine_similarity(tanh_gradient(p, TIGHT_FORWARD, ih.Phantom(k, 0.5)), exact, 0))
        for k in (1, 2, 4, 8)
    ]
    assert all(a < b for a, b in itertools.pairwise(cosines)), cosines
    assert cosines[0] < 0.999 and cosines[-1] > 1 - 1e-4, cosines


def test_neumann_with_many_terms_matches_implicit(tanh_problem) -> None:
    p = tanh_problem(batch=3, width=5)
    exact = tanh_gradient(p, TIGHT_FORWARD, ih.Implicit(linear_solver="dense", tol=1e-12))
    neumann = tanh_gradient(p, TIGHT_FORWARD, ih.Neumann(k=200, tau=0.5))
    assert relative_error(neumann, exact) <= 1e-10


@pytest.mark.parametrize(("k", "tau"), [(1, 1.0), (3, 0.5), (6, 0.8)])
def test_neumann_equals_phantom_at_a_converged_fixed_point(tanh_problem, k, tau) -> None:
    """Both are ``tau * sum_{i<k} B^i df/dθ`` with ``B = tau J + (1 - tau) I`` at z*."""
    p = tanh_problem(batch=3, width=5)
    neumann = tanh_gradient(p, TIGHT_FORWARD, ih.Neumann(k=k, tau=tau))
    phantom = tanh_gradient(p, TIGHT_FORWARD, ih.Phantom(k=k, tau=tau))
    assert relative_error(neumann, phantom) <= 1e-10
