"""Contract of ``fixed_point``: the backward mode changes only the gradient, the layer stays
differentiable in eval mode, repeated backward passes agree, and backward solves report (and
warn about) their convergence."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

import implicit_ham as ih

DT = torch.float64


def all_modes() -> list[ih.plugins.Adjoint]:
    return [
        ih.Unroll(),
        ih.Truncated(3),
        ih.OneStep(),
        ih.Implicit(),
        ih.Neumann(k=4, tau=0.5),
        ih.Phantom(k=3, tau=1.0),
        ih.Phantom(k=2, tau=0.3),
    ]


def loop_until(problem, max_steps: int, tol: float | None) -> Tensor:
    """Plain iteration written here; with ``tol``, each sample stops (is frozen) at its first
    step whose relative residual ``||z_k - z_{k-1}|| / ||z_k||`` is ``<= tol``, and the loop
    once every sample has (per-sample stopping)."""
    z = problem.z0
    running = torch.ones(z.shape[0], dtype=torch.bool)
    with torch.no_grad():
        for _ in range(max_steps):
            z_next = problem.f(z, *problem.args)
            rel = (z_next - z).norm(dim=1) / z_next.norm(dim=1)
            z = torch.where(running[:, None], z_next, z)
            if tol is not None:
                running = running & ~(rel <= tol)
                if not bool(running.any()):
                    break
    return z


@pytest.mark.parametrize("tol", [None, 1e-6])
def test_backward_mode_never_changes_the_forward_value(tanh_problem, tol) -> None:
    problem = tanh_problem(batch=3, width=6, contraction=0.7)
    solver = ih.FixedPointIteration(max_steps=12 if tol is None else 50, tol=tol)
    expected = loop_until(problem, solver.max_steps, tol)
    for adjoint in all_modes():
        sol = ih.fixed_point(problem.f, problem.z0, *problem.args, solver=solver, adjoint=adjoint)
        assert torch.equal(sol.value, expected), adjoint
        assert sol.value.requires_grad, adjoint
        if tol is not None:
            assert bool(sol.stats.converged.all()) and sol.stats.steps < 50


@pytest.mark.parametrize(
    "solver", [ih.Anderson(max_steps=20), ih.Broyden(max_steps=20)], ids=["anderson", "broyden"]
)
def test_at_fixed_point_modes_share_the_accelerated_solvers_value(tanh_problem, solver) -> None:
    problem = tanh_problem(batch=3, width=6, contraction=0.7)
    values = [
        ih.fixed_point(problem.f, problem.z0, *problem.args, solver=solver, adjoint=adjoint).value
        for adjoint in (ih.Implicit(), ih.Neumann(k=4, tau=0.5))
    ]
    assert torch.equal(values[0], values[1])


class FixedPointLayer(nn.Module):
    """``y = z*`` with ``z* = tanh(z* W^T + x + b)``; W, b are parameters. x, y: (B, n)."""

    def __init__(self, width: int, adjoint: ih.plugins.Adjoint) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(3)
        weight = torch.randn(width, width, generator=gen, dtype=DT)
        self.weight = nn.Parameter(0.5 * weight / torch.linalg.matrix_norm(weight, ord=2))
        self.bias = nn.Parameter(torch.randn(width, generator=gen, dtype=DT))
        self.adjoint = adjoint

    def forward(self, x: Tensor) -> Tensor:
        def f(z: Tensor, x: Tensor) -> Tensor:
            return torch.tanh(z @ self.weight.T + x + self.bias)

        solver = ih.FixedPointIteration(max_steps=40, tol=1e-12)
        return ih.fixed_point(f, torch.zeros_like(x), x, solver=solver, adjoint=self.adjoint).value


@pytest.mark.parametrize(
    "adjoint",
    [ih.OneStep(), ih.Unroll(), ih.Implicit(tol=1e-10), ih.Neumann()],
    ids=["one_step", "unroll", "implicit", "neumann"],
)
def test_layer_in_eval_mode_still_has_gradients(adjoint) -> None:
    layer = FixedPointLayer(width=5, adjoint=adjoint)
    x = torch.randn(2, 5, dtype=DT, generator=torch.Generator().manual_seed(4))
    gradients = {}
    for mode in ("train", "eval"):
        layer.train(mode == "train")
        layer.zero_grad()
        y = layer(x)
        assert y.grad_fn is not None, mode
        y.pow(2).sum().backward()
        gradients[mode] = [p.grad.clone() for p in layer.parameters()]
    assert not layer.training
    for train_grad, eval_grad in zip(gradients["train"], gradients["eval"], strict=True):
        assert bool(eval_grad.abs().sum() > 0)
        torch.testing.assert_close(eval_grad, train_grad, rtol=1e-12, atol=0)


def gradients_twice(problem, adjoint: ih.plugins.Adjoint, repeats: int = 2):
    """Solve once, then take ``repeats`` gradients of one loss through the retained graph."""
    solver = ih.FixedPointIteration(max_steps=100, tol=1e-13)
    sol = ih.fixed_point(problem.f, problem.z0, *problem.args, solver=solver, adjoint=adjoint)
    loss = (sol.value * torch.linspace(-1, 1, sol.value.numel(), dtype=DT).view_as(sol.value)).sum()
    grads = [torch.autograd.grad(loss, problem.args, retain_graph=True) for _ in range(repeats)]
    return sol, grads


@pytest.mark.parametrize(
    "adjoint",
    [
        ih.Unroll(),
        ih.Neumann(k=6, tau=0.5),
        ih.Implicit(linear_solver="dense", tol=1e-12),
        ih.Implicit(linear_solver="fixed_point", tol=1e-12),
        ih.Implicit(linear_solver="anderson", tol=1e-12),
        ih.Implicit(linear_solver="broyden", tol=1e-12),
    ],
    ids=[
        "unroll",
        "neumann",
        "implicit-dense",
        "implicit-fixed_point",
        "implicit-anderson",
        "implicit-broyden",
    ],
)
def test_second_backward_with_retain_graph_gives_the_same_gradient(tanh_problem, adjoint) -> None:
    sol, (first, second) = gradients_twice(tanh_problem(batch=3, width=5), adjoint)
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)
    expected_log = 0 if isinstance(adjoint, ih.Unroll) else 2
    assert len(sol.backward_log) == expected_log


def test_second_gmres_backward_gives_the_same_gradient_to_rounding(tanh_problem) -> None:
    sol, (first, second) = gradients_twice(tanh_problem(batch=3, width=5), ih.Implicit(tol=1e-12))
    for a, b in zip(first, second, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-13, atol=1e-15)
    assert len(sol.backward_log) == 2 and all(s.converged for s in sol.backward_log)


def test_gmres_backward_is_bitwise_reproducible(tanh_problem) -> None:
    _, grads = gradients_twice(tanh_problem(batch=3, width=5), ih.Implicit(tol=1e-12), repeats=60)
    for other in grads[1:]:
        for a, b in zip(grads[0], other, strict=True):
            assert torch.equal(a, b)


# --- backward statistics and non-convergence ----------------------------------------------------


def test_backward_statistics_are_recorded_after_backward(tanh_problem) -> None:
    problem = tanh_problem(batch=3, width=5)
    tol = 1e-10
    solver = ih.FixedPointIteration(max_steps=100, tol=1e-13)
    adjoint = ih.Implicit("gmres", tol=tol)
    sol = ih.fixed_point(problem.f, problem.z0, *problem.args, solver=solver, adjoint=adjoint)
    assert sol.backward_stats is None and sol.backward_log == []
    weights = torch.linspace(-1, 1, sol.value.numel(), dtype=DT).view_as(sol.value)
    (sol.value * weights).sum().backward()

    stats = sol.backward_stats
    assert stats is not None and len(sol.backward_log) == 1
    assert stats.adjoint == "implicit" and stats.linear_solver == "gmres"
    assert stats.steps > 0
    assert stats.converged is True and stats.rel_residual <= tol
    # the incoming gradient v is `weights`, so rel = abs / ||v||
    assert stats.abs_residual == pytest.approx(stats.rel_residual * float(weights.norm()))


def test_neumann_backward_statistics_count_its_vjps(tanh_problem) -> None:
    problem = tanh_problem(batch=2, width=4)
    sol = ih.fixed_point(problem.f, problem.z0, *problem.args, adjoint=ih.Neumann(k=7, tau=0.5))
    sol.value.sum().backward()
    assert sol.backward_stats.linear_solver == "neumann_series"
    assert sol.backward_stats.steps == 6 and sol.backward_stats.converged is None


def slow_linear_problem() -> tuple[Tensor, Tensor, Tensor]:
    """``f(z, x) = z A + x`` with A symmetric, eigenvalues 0.95 and 0.5 (spectral radius 0.95).

    Returns (A (3, 3), x (1, 3) requiring grad, u (3,) the unit eigenvector of eigenvalue 0.95).
    """
    gen = torch.Generator().manual_seed(5)
    Q, _ = torch.linalg.qr(torch.randn(3, 3, generator=gen, dtype=DT))
    A = Q @ torch.diag(torch.tensor([0.95, 0.5, 0.5], dtype=DT)) @ Q.T
    x = torch.randn(1, 3, generator=gen, dtype=DT).requires_grad_()
    return A, x, Q[:, 0]


def test_non_converged_backward_warns_with_its_residual() -> None:
    A, x, u = slow_linear_problem()
    adjoint = ih.Implicit(
        linear_solver="fixed_point", max_steps=2, tol=1e-8, fixed_point_tol=None
    )
    sol = ih.fixed_point(lambda z, x: z @ A + x, torch.zeros(1, 3, dtype=DT), x, adjoint=adjoint)
    v = u[None]  # incoming gradient along the slow eigenvector
    with pytest.warns(ih.ConvergenceWarning, match="relative residual") as record:
        (sol.value * v).sum().backward()

    stats = sol.backward_stats
    assert stats.converged is False and stats.steps == 2
    # two Neumann steps from g = v leave the residual (J^T)^3 v, i.e. 0.95^3 along u
    assert stats.rel_residual == pytest.approx(0.95**3, rel=1e-12)
    assert f"{stats.rel_residual:.3e}" in str(record[0].message)


def test_non_converged_backward_raises_when_asked() -> None:
    A, x, u = slow_linear_problem()
    adjoint = ih.Implicit(
        linear_solver="fixed_point", max_steps=2, on_divergence="raise", fixed_point_tol=None
    )
    sol = ih.fixed_point(lambda z, x: z @ A + x, torch.zeros(1, 3, dtype=DT), x, adjoint=adjoint)
    with pytest.raises(RuntimeError, match=r"did not reach tol=1e-05 in 2 VJPs"):
        (sol.value * u[None]).sum().backward()


def test_state_of_one_scalar_per_sample_is_supported() -> None:
    """A (B,) state: z <- z / 2 + 1 converges to 2 for every sample; residual trace is (K, B)."""
    z0 = torch.zeros(3, dtype=torch.float64)
    solver = ih.FixedPointIteration(max_steps=40, trace=True)
    sol = ih.fixed_point(lambda z: 0.5 * z + 1, z0, solver=solver)
    torch.testing.assert_close(sol.value, torch.full((3,), 2.0, dtype=torch.float64))
    assert sol.stats.residuals.shape == (40, 3)
    torch.testing.assert_close(sol.stats.residuals[0], torch.ones(3, dtype=torch.float64))
