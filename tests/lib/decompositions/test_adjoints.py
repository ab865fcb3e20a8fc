"""Every backward mode of the core runs on every decomposition without changing the forward
value, and the gradients agree with independent references (finite differences, autograd
through ``torch.linalg.svd``)."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

import implicit_ham as ih

ADJOINTS = {
    "unroll": ih.Unroll(),
    "truncated2": ih.Truncated(2),
    "one_step": ih.OneStep(),
    "phantom": ih.Phantom(k=2, tau=1.0),
    "phantom_damped": ih.Phantom(k=2, tau=0.5),
    "neumann": ih.Neumann(k=3, tau=0.5),
    "implicit": ih.Implicit(linear_solver="gmres", max_steps=30),
}
KINDS = ["nmf", "vq", "cd", "svd"]


def inputs(kind: str, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(2, 6, 3, 4, generator=gen, dtype=torch.float64) + 0.1
    if kind != "nmf":
        x = 2 * x - 1.1
    d0 = torch.rand(4, 3, 2, generator=gen, dtype=torch.float64)
    weight = torch.randn(x.shape, generator=gen, dtype=torch.float64)
    return x, d0 / d0.norm(dim=1, keepdim=True), weight


@pytest.mark.parametrize("kind", KINDS)
def test_every_backward_mode_runs_and_keeps_the_forward_value(kind):
    x, d0, weight = inputs(kind)
    outputs, grads = {}, {}
    for name, adjoint in ADJOINTS.items():
        layer = ih.make_decomposition(kind, rank=2, groups=2, steps=4, adjoint=adjoint)
        xg = x.clone().requires_grad_()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ih.ConvergenceWarning)
            y = layer(xg, init=d0)
            (y * weight).sum().backward()
        outputs[name], grads[name] = y.detach(), xg.grad
        assert layer.last_solution is not None and layer.last_solution.stats.steps == 4
        assert torch.isfinite(xg.grad).all() and xg.grad.abs().max() > 0, name
    for name in ADJOINTS:  # damped phantom steps included: they shape the gradient only
        assert torch.equal(outputs[name], outputs["unroll"]), name
    assert not torch.equal(grads["one_step"], grads["unroll"])


@pytest.mark.parametrize("kind", ["nmf", "cd", "svd"])
def test_unroll_gradient_matches_finite_differences(kind):
    """VQ is left out on purpose: its readout holds ||X|| constant (the official code's
    ``no_grad`` norm), so even its unrolled gradient is not the derivative of its output."""
    x, d0, _ = inputs(kind, seed=1)
    layer = ih.make_decomposition(kind, rank=2, groups=2, steps=3, adjoint=ih.Unroll())
    if kind in ("vq", "cd"):
        layer.inv_t = 3.0  # a temperature at which finite differences are well resolved
    xg = x.clone().requires_grad_()
    assert torch.autograd.gradcheck(
        lambda t: layer(t, init=d0), (xg,), eps=1e-6, atol=1e-6, fast_mode=True
    )


def test_implicit_gradient_matches_finite_differences_at_a_converged_cd():
    """CD at inv_t = 100 converges in a few steps, so the gradient of the (converged) forward
    map is the implicit gradient; finite differences of the whole forward are the reference."""
    x, d0, weight = inputs("cd", seed=2)
    layer = ih.CD(rank=2, groups=2, steps=15, adjoint=ih.Implicit(linear_solver="dense"))
    xg = x.clone().requires_grad_()
    (layer(xg, init=d0) * weight).sum().backward()
    assert layer.last_solution.stats.abs_residual.max() < 1e-10
    assert layer.last_solution.backward_stats.rel_residual < 1e-10

    def loss(t: torch.Tensor) -> float:
        return float((layer(t, init=d0) * weight).sum())

    gen = torch.Generator().manual_seed(3)
    for _ in range(4):  # central differences along random directions
        v = torch.randn(x.shape, generator=gen, dtype=x.dtype)
        h = 1e-6
        fd = (loss(x + h * v) - loss(x - h * v)) / (2 * h)
        assert abs(float((xg.grad * v).sum()) - fd) < 1e-6 * max(1.0, abs(fd))


def test_svd_implicit_gradient_matches_autograd_through_linalg_svd():
    """The truncated-SVD projection X_r = U_r U_r^T X differentiated by torch.linalg.svd is an
    independent reference for the implicit gradient of the subspace iteration."""
    gen = torch.Generator().manual_seed(4)
    u, _ = torch.linalg.qr(torch.randn(5, 5, generator=gen, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(12, 12, generator=gen, dtype=torch.float64))
    s = torch.zeros(5, 12, dtype=torch.float64)
    s[range(5), range(5)] = torch.tensor([6.0, 3.0, 0.8, 0.5, 0.2], dtype=torch.float64)
    x = (u @ s @ v.T).reshape(1, 5, 3, 4)
    weight = torch.randn(x.shape, generator=gen, dtype=torch.float64)

    xr = x.clone().requires_grad_()
    uu, _, _ = torch.linalg.svd(xr.reshape(5, 12), full_matrices=False)
    proj = uu[:, :2] @ uu[:, :2].T @ xr.reshape(5, 12)
    (proj.reshape(x.shape) * weight).sum().backward()

    for adjoint in (ih.Implicit(linear_solver="gmres", tol=1e-12), ih.Unroll()):
        layer = ih.SVD(rank=2, steps=40, adjoint=adjoint)
        xg = x.clone().requires_grad_()
        y = layer(xg)
        (y * weight).sum().backward()
        assert (y - proj.reshape(x.shape)).abs().max().item() < 1e-10
        assert (xg.grad - xr.grad).abs().max().item() < 1e-8, adjoint


def test_one_step_bases_get_no_gradient_but_grad_through_bases_does():
    """Paper one-step: explicit initial bases and the solve receive no gradient; with Unroll
    the initial bases do (BPTT is the only mode reaching z0)."""
    x, d0, weight = inputs("vq", seed=5)
    for adjoint, reaches in ((ih.OneStep(), False), (ih.Unroll(), True)):
        layer = ih.VQ(rank=2, groups=2, steps=2, inv_t=3.0, adjoint=adjoint)
        bases = d0.clone().requires_grad_()
        (layer(x.clone().requires_grad_(), init=bases) * weight).sum().backward()
        assert (bases.grad is not None and bases.grad.abs().max() > 0) == reaches


def test_implicit_problem_is_the_problem_forward_solves():
    x, d0, weight = inputs("cd", seed=6)
    layer = ih.CD(rank=2, groups=2, steps=5, adjoint=ih.Unroll())
    xg = x.clone().requires_grad_()
    y = layer(xg, init=d0)
    (y * weight).sum().backward()

    x2 = x.clone().requires_grad_()
    problem = layer.implicit_problem(x2, init=d0)
    assert problem.args[0].shape == (4, 3, 12)
    solution = problem.solve(layer.active_solver(), ih.Unroll())
    y2 = layer.unflatten(layer.readout(problem.args[0], solution.value), x.shape)
    (y2 * weight).sum().backward()
    assert torch.equal(y.detach(), y2.detach())
    assert torch.allclose(xg.grad, x2.grad, rtol=0, atol=1e-14)


def test_adjoint_attribute_can_be_swapped_and_named():
    x, d0, weight = inputs("cd", seed=7)
    layer = ih.CD(rank=2, groups=2, steps=6)
    layer.adjoint = "neumann"
    xg = x.clone().requires_grad_()
    (layer(xg, init=d0) * weight).sum().backward()
    assert layer.last_solution.backward_stats.adjoint == "neumann"


def test_last_solution_records_backward_stats_and_the_module_stays_copyable():
    x, d0, weight = inputs("cd", seed=8)
    layer = ih.CD(rank=2, groups=2, steps=8, adjoint=ih.Implicit(linear_solver="dense"))
    xg = x.clone().requires_grad_()
    (layer(xg, init=d0) * weight).sum().backward()
    solution = layer.last_solution
    assert not solution.value[0].requires_grad and len(solution.backward_log) == 1
    assert solution.backward_stats.linear_solver == "dense"
    assert copy.deepcopy(layer).last_solution.stats.steps == 8
