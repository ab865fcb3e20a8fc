"""The two ways a tolerance solve decides which samples stop (``iteration._Running``): read on
the host (a batch of at most ``_HOST_REDUCE`` samples) or reduced on the device (larger
batches). Both give bitwise the same value, per-sample stops, trace and gradient (the replay
of Truncated(k) included), and both stop on a NaN with the same error. The device path is
forced on a small batch by lowering ``_HOST_REDUCE``."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

import implicit_ham as ih
from implicit_ham.solvers import iteration

WIDTH = 16
RATES = torch.tensor([0.3, 0.95, 0.5, 0.1, 0.8, 0.0], dtype=torch.float64)


def f(z: Tensor, x: Tensor) -> Tensor:
    """``tanh(rate_i W z_i + x_i)``: samples converge at different steps (sample 5 at once)."""
    gen = torch.Generator().manual_seed(4)
    weight = torch.randn(WIDTH, WIDTH, generator=gen, dtype=torch.float64)
    weight = weight / torch.linalg.matrix_norm(weight, ord=2)
    return torch.tanh(RATES[:, None] * (z @ weight.T) + x)


def solve(adjoint: ih.Adjoint, tol: float = 1e-9) -> tuple[ih.Solution, Tensor]:
    x = torch.randn(6, WIDTH, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    x.requires_grad_()
    solver = ih.FixedPointIteration(max_steps=300, tol=tol)
    sol = ih.fixed_point(
        f, torch.zeros(6, WIDTH, dtype=torch.float64), x, solver=solver, adjoint=adjoint
    )
    sol.value.square().sum().backward()
    assert x.grad is not None
    return sol, x.grad


@pytest.mark.parametrize("adjoint", [ih.OneStep(), ih.Truncated(12), ih.Unroll(), ih.Implicit()])
def test_host_and_device_decisions_give_the_same_solve(adjoint, monkeypatch) -> None:
    host, host_grad = solve(adjoint)
    monkeypatch.setattr(iteration, "_HOST_REDUCE", 0)
    device, device_grad = solve(adjoint)
    steps = host.stats.sample_steps
    assert steps is not None and int(steps.min()) < 12 < int(steps.max())  # staggered stops
    assert steps.tolist() == device.stats.sample_steps.tolist()
    assert steps.dtype == torch.int64
    assert torch.equal(host.value, device.value)
    assert torch.equal(host.stats.residuals, device.stats.residuals)
    assert torch.equal(host.stats.converged, device.stats.converged)
    assert bool(host.stats.converged.all())
    assert torch.equal(host_grad, device_grad)


def test_a_batch_that_stops_together_has_no_per_sample_steps(monkeypatch) -> None:
    x = torch.randn(3, WIDTH, dtype=torch.float64)
    solver = ih.FixedPointIteration(max_steps=50, tol=1e-3)
    for reduce in (256, 0):
        monkeypatch.setattr(iteration, "_HOST_REDUCE", reduce)
        with torch.no_grad():
            sol = ih.fixed_point(
                lambda z, x: 0.0 * z + x, torch.zeros(3, WIDTH).double(), x, solver=solver
            )
        assert sol.stats.steps == 2 and sol.stats.sample_steps is None


@pytest.mark.parametrize("reduce", [256, 0])
def test_a_nan_in_a_running_sample_stops_the_solve_and_is_named(reduce, monkeypatch) -> None:
    monkeypatch.setattr(iteration, "_HOST_REDUCE", reduce)
    rates = torch.tensor([0.1, 0.5])

    def blows_up(z: Tensor) -> Tensor:
        nxt = rates[:, None] * z + 1.0
        return torch.where(z.abs().sum(1, keepdim=True) > 5, torch.nan, nxt)

    solver = ih.FixedPointIteration(max_steps=100, tol=1e-10)
    with pytest.raises(ih.errors.NonFiniteError, match="forward step 3"), torch.no_grad():
        ih.fixed_point(blows_up, torch.zeros(2, 4), solver=solver)


@pytest.mark.parametrize("reduce", [256, 0], ids=["host", "device"])
def test_huge_finite_metrics_are_not_read_as_non_finite(reduce, monkeypatch) -> None:
    """Finite float64 metrics whose sum overflows (3 x 1e308) are read as finite, with the
    largest as the worst, on both paths; a NaN among them is read as NaN."""
    monkeypatch.setattr(iteration, "_HOST_REDUCE", reduce)
    running = iteration._Running(3, torch.device("cpu"))
    high, some_met = running.read(torch.tensor([1e308, 9e307, -1.0], dtype=torch.float64))
    assert high == 1e308 and some_met
    running = iteration._Running(3, torch.device("cpu"))
    high, _ = running.read(torch.tensor([1e308, float("nan"), -1.0], dtype=torch.float64))
    assert high != high  # NaN
