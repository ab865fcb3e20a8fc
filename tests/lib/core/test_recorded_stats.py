"""``RecordedStats``: a solve's statistics computed from the recorded norms when first read.
Their values equal a float64 evaluation from the iterates; building them runs no tensor
operation (the end of a solve that nobody inspects pays nothing); they behave as plain
``SolverStats`` under ``dataclasses.replace``, pickling and assignment, and under vmap."""

from __future__ import annotations

import copy
import dataclasses
import pickle

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

import implicit_ham as ih
from implicit_ham._core.stats import RecordedStats, TraceRecorder

WIDTH = 12


class CountOps(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.count += 1
        return func(*args, **(kwargs or {}))


def problem() -> tuple[Tensor, Tensor]:
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(WIDTH, WIDTH, generator=gen, dtype=torch.float64)
    weight = 0.8 * weight / torch.linalg.matrix_norm(weight, ord=2)
    return weight, torch.randn(3, WIDTH, generator=gen, dtype=torch.float64)


def test_values_equal_the_iterates_own_residuals() -> None:
    weight, x = problem()

    def f(z: Tensor) -> Tensor:
        return torch.tanh(z @ weight.T + x)

    iterates = [torch.zeros(3, WIDTH, dtype=torch.float64)]
    for _ in range(7):
        iterates.append(f(iterates[-1]))
    change = (iterates[-1] - iterates[-2]).norm(dim=1)
    for solver in (ih.FixedPointIteration(max_steps=7), ih.FixedPointIteration(7, trace=True)):
        with torch.no_grad():
            stats = ih.fixed_point(f, iterates[0], solver=solver).stats
        assert isinstance(stats, RecordedStats) and stats.steps == 7
        torch.testing.assert_close(stats.abs_residual, change, rtol=1e-12, atol=0)
        torch.testing.assert_close(
            stats.rel_residual, change / iterates[-1].norm(dim=1), rtol=1e-12, atol=0
        )
        assert stats.residuals.shape == ((7, 3) if solver.trace else (1, 3))
        torch.testing.assert_close(stats.residuals[-1], change, rtol=1e-12, atol=0)
        assert stats.converged is None and stats.sample_steps is None
    zero = ih.fixed_point(lambda z: 0.0 * z, torch.zeros(2, 3), solver=ih.FixedPointIteration(2))
    assert zero.stats.rel_residual.tolist() == [0.0, 0.0]  # a zero iterate counts as tiny


def test_building_runs_no_tensor_operation_and_reading_computes_once() -> None:
    rec = TraceRecorder("fixed_point")
    prev, nxt = torch.zeros(4, 5), torch.ones(4, 5)
    rec.record((prev,), (nxt,))
    with CountOps() as ops:
        stats = rec.build(4, prev.device, prev.dtype, 1e-3, "rel")
    assert ops.count == 0
    with CountOps() as ops:
        converged = stats.converged
    assert ops.count > 0 and converged is not None and not bool(converged.any())
    with CountOps() as ops:
        stats.rel_residual, stats.residuals, stats.abs_residual  # noqa: B018
    assert ops.count == 0  # computed once, with the first read
    torch.testing.assert_close(stats.abs_residual, torch.full((4,), 5**0.5))


def test_replace_pickle_copy_and_assignment_behave_as_for_solver_stats() -> None:
    with torch.no_grad():
        stats = ih.fixed_point(
            lambda z: 0.5 * z + 1, torch.zeros(2, 3), solver=ih.FixedPointIteration(5)
        ).stats
    expected = stats.rel_residual.clone()
    for other in (
        dataclasses.replace(stats, steps=9),
        pickle.loads(pickle.dumps(stats)),
        copy.deepcopy(stats),
    ):
        assert torch.equal(other.rel_residual, expected)
        assert other.solver == "fixed_point" and other.converged is None
    assert dataclasses.replace(stats, steps=9).steps == 9
    stats.rel_residual = torch.zeros(2)
    assert stats.summary()["rel_residual"] == 0.0
    assert "rel_residual=tensor([0., 0.])" in repr(stats)


def test_under_vmap_the_stats_are_each_problems_own() -> None:
    weight, x = problem()

    def solve(inputs: Tensor) -> Tensor:
        sol = ih.fixed_point(
            lambda z, u: torch.tanh(z @ weight.T + u),
            torch.zeros(3, WIDTH, dtype=torch.float64),
            inputs,
            solver=ih.FixedPointIteration(max_steps=20),
        )
        return sol.stats.rel_residual

    rel = torch.func.vmap(solve)(torch.stack((x, 2 * x)))
    for i, inputs in enumerate((x, 2 * x)):
        with torch.no_grad():
            plain = ih.fixed_point(
                lambda z, u: torch.tanh(z @ weight.T + u),
                torch.zeros(3, WIDTH, dtype=torch.float64),
                inputs,
                solver=ih.FixedPointIteration(max_steps=20),
            ).stats.rel_residual
        torch.testing.assert_close(rel[i], plain, rtol=1e-6, atol=1e-15)
