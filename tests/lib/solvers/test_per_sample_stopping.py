"""Per-sample stopping: with a tolerance a converged sample is frozen while the others go on, so
a sample's value and step count do not depend on its batch-mates (FixedPointIteration and the
native Anderson / Broyden), and the value stays the same under every backward mode."""

from __future__ import annotations

import re
import warnings

import pytest
import torch
from torch import Tensor

import implicit_ham as ih

WIDTH = 24


def contraction_problem() -> tuple[Tensor, Tensor, Tensor]:
    """W (N, N) with ||W||_2 = 1, per-sample contraction rates (sample 1 is slow) and x."""
    gen = torch.Generator().manual_seed(3)
    weight = torch.randn(WIDTH, WIDTH, generator=gen)
    weight = weight / torch.linalg.matrix_norm(weight, ord=2)
    rates = torch.tensor([0.3, 0.97, 0.5, 0.1])
    return weight, rates, torch.randn(4, WIDTH, generator=gen)


def f(z: Tensor, x: Tensor, rates: Tensor, weight: Tensor) -> Tensor:
    """``tanh(rate_i W z_i + x_i)``: each sample on its own, with its own contraction rate."""
    return torch.tanh(rates[:, None] * (z @ weight.T) + x)


SOLVERS = {
    "fixed_point": lambda: ih.FixedPointIteration(max_steps=400, tol=1e-5),
    "anderson": lambda: ih.Anderson(max_steps=80, tol=1e-5),
    "broyden": lambda: ih.Broyden(max_steps=80, tol=1e-5),
}


@pytest.mark.parametrize("name", sorted(SOLVERS))
def test_a_sample_alone_and_beside_a_slow_neighbour_agree(name: str) -> None:
    weight, rates, x = contraction_problem()
    solver = SOLVERS[name]()
    with torch.no_grad():
        batch = ih.fixed_point(f, torch.zeros(4, WIDTH), x, rates, weight, solver=solver)
    steps = batch.stats.steps_per_sample()
    assert batch.stats.sample_steps is not None  # the slow sample took more steps
    assert int(steps[1]) == batch.stats.steps > int(steps[3])
    for i in range(4):
        with torch.no_grad():
            alone = ih.fixed_point(
                f, torch.zeros(1, WIDTH), x[i : i + 1], rates[i : i + 1], weight, solver=solver
            )
        rel = float((batch.value[i] - alone.value[0]).norm() / alone.value[0].norm())
        assert rel <= 1e-6, (name, i, rel)
        assert int(steps[i]) == alone.stats.steps, (name, i)
        torch.testing.assert_close(
            batch.stats.rel_residual[i], alone.stats.rel_residual[0], rtol=0.05, atol=2e-7
        )
        assert bool(batch.stats.converged[i])


@pytest.mark.parametrize("name", sorted(SOLVERS))
def test_frozen_samples_keep_their_stop_in_the_trace(name: str) -> None:
    """After its stop a sample's rows repeat its residual at the stop (as alone)."""
    weight, rates, x = contraction_problem()
    with torch.no_grad():
        sol = ih.fixed_point(f, torch.zeros(4, WIDTH), x, rates, weight, solver=SOLVERS[name]())
    stop = int(sol.stats.steps_per_sample()[3])
    rows = sol.stats.residuals[:, 3]
    assert torch.equal(rows[stop - 1 :], rows[stop - 1].expand(len(rows) - stop + 1))
    assert torch.equal(sol.stats.abs_residual[3], rows[stop - 1])


def double(t: Tensor) -> Tensor:
    return t.to(torch.float64)


@pytest.mark.parametrize(
    ("name", "adjoints"),
    [
        ("fixed_point", [ih.Unroll(), ih.Truncated(3), ih.OneStep(), ih.Implicit(), ih.Phantom()]),
        ("anderson", [ih.OneStep(), ih.Truncated(2), ih.Implicit(), ih.Neumann()]),
        ("broyden", [ih.OneStep(), ih.Implicit()]),
    ],
)
def test_per_sample_value_is_the_same_under_every_backward_mode(name, adjoints) -> None:
    weight, rates, x = contraction_problem()
    weight, rates, x = double(weight), double(rates), double(x)
    values = []
    for adjoint in adjoints:
        xg = x.clone().requires_grad_()
        sol = ih.fixed_point(
            f,
            torch.zeros(4, WIDTH, dtype=torch.float64),
            xg,
            rates,
            weight,
            solver=SOLVERS[name](),
            adjoint=adjoint,
        )
        assert sol.stats.sample_steps is not None
        sol.value.square().sum().backward()
        assert xg.grad is not None and bool(torch.isfinite(xg.grad).all())
        values.append(sol.value.detach())
    for value in values[1:]:
        assert torch.equal(value, values[0])


def solve_f64(x: Tensor, rates: Tensor, weight: Tensor, solver, adjoint) -> ih.Solution:
    """``f`` solved from zeros in float64 for the samples of ``x`` (B, N)."""
    z0 = torch.zeros(x.shape[0], WIDTH, dtype=torch.float64)
    return ih.fixed_point(f, z0, x, rates, weight, solver=solver, adjoint=adjoint)


def test_one_step_gradient_of_a_frozen_sample_is_its_own_last_step() -> None:
    """OneStep through per-sample stops: each sample's gradient is that of f at its own
    second-to-last iterate (compared with the sample solved alone)."""
    weight, rates, x = (double(t) for t in contraction_problem())
    solver = ih.FixedPointIteration(max_steps=400, tol=1e-8)
    xg = x.clone().requires_grad_()
    sol = solve_f64(xg, rates, weight, solver, ih.OneStep())
    sol.value.square().sum().backward()
    for i in range(4):
        xi = x[i : i + 1].clone().requires_grad_()
        alone = solve_f64(xi, rates[i : i + 1], weight, solver, ih.OneStep())
        alone.value.square().sum().backward()
        torch.testing.assert_close(xg.grad[i], xi.grad[0], rtol=1e-10, atol=1e-12)


def test_truncated_replay_of_a_sample_that_stopped_early_keeps_its_own_steps() -> None:
    """Truncated(k) with k above a sample's step count: the replay starts at z0 for it and runs
    only its own steps (its value and Unroll-like gradient are those of solving it alone)."""
    weight, rates, x = (double(t) for t in contraction_problem())
    solver = ih.FixedPointIteration(max_steps=400, tol=1e-4)
    with torch.no_grad():
        fast = ih.fixed_point(
            f, torch.zeros(4, WIDTH, dtype=torch.float64), x, rates, weight, solver=solver
        ).stats.steps_per_sample()
    k = int(fast[3]) + 2  # sample 3 stops before k steps, sample 1 after
    assert k < int(fast[1])
    xg = x.clone().requires_grad_()
    sol = solve_f64(xg, rates, weight, solver, ih.Truncated(k))
    sol.value.square().sum().backward()
    xi = x[3:4].clone().requires_grad_()
    alone = solve_f64(xi, rates[3:4], weight, solver, ih.Unroll())
    alone.value.square().sum().backward()
    torch.testing.assert_close(sol.value[3], alone.value[0], rtol=1e-12, atol=0)
    torch.testing.assert_close(xg.grad[3], xi.grad[0], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("tol", [None, 1e-7])
def test_anderson_polish_choice_is_measured_and_the_same_under_every_backward_mode(tol) -> None:
    """``polish=True`` returns, per sample, the better of x_best and f(x_best) by a measured
    residual: the reported residual is the returned point's (recomputed here), the budget is
    kept, and the value is the same under every backward mode."""
    weight, rates, x = (double(t) for t in contraction_problem())
    calls = [0]

    def counted(z: Tensor, x: Tensor, rates: Tensor, weight: Tensor) -> Tensor:
        calls[0] += 1
        return f(z, x, rates, weight)

    solver = ih.Anderson(max_steps=11, tol=tol, polish=True)
    values = []
    for adjoint in (ih.OneStep(), ih.Truncated(2), ih.Implicit(), ih.Neumann()):
        xg = x.clone().requires_grad_()
        calls[0] = 0
        sol = ih.fixed_point(
            counted,
            torch.zeros(4, WIDTH, dtype=torch.float64),
            xg,
            rates,
            weight,
            solver=solver,
            adjoint=adjoint,
        )
        with torch.no_grad():
            fz = f(sol.value, x, rates, weight)
        measured = (fz - sol.value).norm(dim=1) / fz.norm(dim=1)
        torch.testing.assert_close(sol.stats.rel_residual, measured, rtol=1e-9, atol=1e-15)
        # the iteration's budget is max_steps, the polish evaluation included (issue 45 item 9)
        assert sol.stats.steps <= 11 and sol.stats.residuals.shape[0] == sol.stats.steps
        sol.value.square().sum().backward()
        values.append(sol.value.detach())
    for value in values[1:]:
        assert torch.equal(value, values[0])
    with torch.no_grad():
        plain = ih.fixed_point(
            f,
            torch.zeros(4, WIDTH, dtype=torch.float64),
            x,
            rates,
            weight,
            solver=ih.Anderson(max_steps=11, tol=tol),
        )
    assert bool((sol.stats.rel_residual <= plain.stats.rel_residual * 1.0000001).all()) or (
        tol is None
    )


def coupled(z: Tensor, x: Tensor, rates: Tensor, weight: Tensor) -> Tensor:
    """``f`` plus a tenth of the batch mean: every sample depends on its batch-mates."""
    return torch.tanh(rates[:, None] * (z @ weight.T) + 0.1 * z.mean(0, keepdim=True) + x)


@pytest.mark.parametrize("adjoint", [ih.OneStep(), ih.Truncated(3)], ids=["one_step", "truncated"])
def test_a_batch_coupled_f_keeps_the_solves_value_and_warns(adjoint) -> None:
    weight, rates, x = contraction_problem()
    x = x.double().requires_grad_(True)
    args = (x, rates.double(), weight.double())
    solver = ih.FixedPointIteration(max_steps=400, tol=1e-10)
    z0 = torch.zeros(4, WIDTH, dtype=torch.float64)
    unrolled = ih.fixed_point(coupled, z0, *args, solver=solver, adjoint=ih.Unroll())
    steps = unrolled.stats.steps_per_sample()
    assert len(set(steps.tolist())) > 1  # the samples stop at different steps
    with pytest.warns(ih.BatchCouplingWarning, match=r"differ from the solve's value") as seen:
        replayed = ih.fixed_point(coupled, z0, *args, solver=solver, adjoint=adjoint)
    # the value is the solve's under every backward mode, bit for bit
    assert torch.equal(replayed.value.detach(), unrolled.value.detach())
    found = re.search(r"by up to ([0-9.e+-]+):", str(seen[0].message))
    assert found is not None and 0.0 < float(found.group(1)) < 1e-6
    if isinstance(adjoint, ih.OneStep):  # the reported difference, by hand
        assert float(found.group(1)) == pytest.approx(one_step_replay_gap(args, 1e-10), rel=1e-3)
    (grad,) = torch.autograd.grad(replayed.value.sum(), x)
    assert torch.isfinite(grad).all() and grad.abs().sum() > 0


def one_step_replay_gap(args: tuple[Tensor, ...], tol: float) -> float:
    """The plain per-sample-frozen iteration of ``coupled`` by hand; f applied once to the batch
    of each sample's iterate before its stop, against the solve's value."""
    z = torch.zeros(4, WIDTH, dtype=torch.float64)
    start, active = z.clone(), torch.ones(4, dtype=torch.bool)
    with torch.no_grad():
        while active.any():
            nxt = coupled(z, *args)
            rel = (nxt - z).norm(dim=1) / nxt.norm(dim=1)
            done = active & (rel <= tol)
            start[done] = z[done]
            z = torch.where(active[:, None], nxt, z)
            active &= ~done
        return float((coupled(start, *args) - z).abs().max())


def test_an_independent_f_replays_without_a_warning() -> None:
    weight, rates, x = contraction_problem()
    solver = ih.FixedPointIteration(max_steps=400, tol=1e-5)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ih.BatchCouplingWarning)
        sol = ih.fixed_point(f, torch.zeros(4, WIDTH), x.requires_grad_(True), rates, weight,
                             solver=solver, adjoint=ih.OneStep())  # fmt: skip
    assert len(set(sol.stats.steps_per_sample().tolist())) > 1
