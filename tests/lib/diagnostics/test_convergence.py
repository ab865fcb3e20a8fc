"""Convergence traces, steps to tolerance and gradient-vs-K rows against closed forms."""

from __future__ import annotations

import math

import pytest
import torch

import implicit_ham as ih
from implicit_ham.diagnostics import (
    bptt_grad_norms,
    convergence_rows,
    convergence_trace,
    grad_vs_k,
    steps_to_tolerance,
)

F64 = torch.float64


def _scalar_problem(a: torch.Tensor, x: torch.Tensor) -> ih.FixedPointProblem:
    """z <- a * z + x per sample, from z0 = 0: z_k = x (1 - a^k) / (1 - a)."""
    return ih.FixedPointProblem(lambda z, x: a * z + x, torch.zeros_like(x), (x,))


def test_residual_and_objective_traces_follow_the_closed_form() -> None:
    a = torch.tensor([0.5, -0.25], dtype=F64)
    x = torch.tensor([1.0, 2.0], dtype=F64)
    tr = convergence_trace(
        _scalar_problem(a, x), ih.FixedPointIteration(max_steps=8), objective=lambda z: z**2
    )
    k = torch.arange(8, dtype=F64)[:, None]
    z_k = x * (1 - a**k) / (1 - a)  # the iterate at which step k + 1 evaluates f
    z_next = x * (1 - a ** (k + 1)) / (1 - a)
    torch.testing.assert_close(tr.residuals, (z_next - z_k).abs())
    torch.testing.assert_close(tr.rel_residuals, (z_next - z_k).abs() / z_next.abs())
    torch.testing.assert_close(tr.objective, z_k**2)
    assert tr.solver == "fixed_point"


def test_steps_to_tolerance_is_first_crossing_or_minus_one() -> None:
    residuals = torch.tensor([[1.0, 1.0], [0.1, 1.0], [0.01, 0.5], [0.001, 0.4]])
    assert steps_to_tolerance(residuals, 0.05).tolist() == [3, -1]
    assert steps_to_tolerance(residuals, 1.0).tolist() == [1, 1]


def test_convergence_rows_for_several_solvers() -> None:
    a = torch.full((3,), 0.5, dtype=F64)
    x = torch.ones(3, dtype=F64)
    solvers = {"fpi": ih.FixedPointIteration(max_steps=60, tol=1e-10), "anderson": "anderson"}
    rows, traces = convergence_rows(_scalar_problem(a, x), solvers, tol=1e-6)
    assert [r["solver"] for r in rows] == ["fpi", "anderson"]
    fpi = rows[0]
    # step s: residual 0.5^(s-1), ||f(z)|| = 2 (1 - 0.5^s), so the relative residual
    # 0.5^s / (1 - 0.5^s) is <= 1e-6 from s = 20 on
    assert fpi["steps_to_1e-06"] == 20
    assert fpi["contraction"] == pytest.approx(0.5, rel=1e-9)
    assert fpi["final_rel_residual"] <= 1e-10
    assert set(traces) == {"fpi", "anderson"}


def test_bptt_gradient_norm_as_a_function_of_k() -> None:
    a = torch.tensor([0.5, 0.9], dtype=F64)
    x = torch.tensor([1.0, -1.0], dtype=F64, requires_grad=True)
    ks = [1, 3, 10]
    rows = bptt_grad_norms(_scalar_problem(a, x), lambda z: z.sum(), ks)
    assert [r["K"] for r in rows] == ks
    for row in rows:
        grad = (1 - a ** row["K"]) / (1 - a)  # d z_K / d x
        assert row["grad_norm"] == pytest.approx(float(grad.norm()), rel=1e-12)
    exact = 1 / (1 - a)
    assert rows[0]["ref_grad_norm"] == pytest.approx(float(exact.norm()), rel=1e-9)
    assert rows[-1]["rel_error"] < rows[0]["rel_error"]


def test_grad_vs_k_one_step_is_flat_and_cosine_is_known() -> None:
    a = torch.tensor([0.5, 0.9], dtype=F64)
    x = torch.tensor([1.0, -1.0], dtype=F64, requires_grad=True)
    rows = grad_vs_k(_scalar_problem(a, x), lambda z: z.sum(), [2, 5], {"one_step": ih.OneStep()})
    exact = 1 / (1 - a)
    one = torch.ones(2, dtype=F64)  # the one-step gradient: d(a z + x)/dx = 1
    cosine = float(one @ exact / (one.norm() * exact.norm()))
    for row in rows:
        assert row["grad_norm"] == pytest.approx(math.sqrt(2), rel=1e-12)
        assert row["cosine"] == pytest.approx(cosine, rel=1e-9)


def test_grad_vs_k_same_k_cosine_against_the_k_step_gradient() -> None:
    """z_K = a^K z0 + x (1 - a^K) / (1 - a): the K-step (Unroll) gradient of sum(z_K) is
    (1 - a^K) / (1 - a) per entry; the one-step one is 1."""
    a = torch.tensor([0.5, 0.9], dtype=F64)
    x = torch.tensor([1.0, -1.0], dtype=F64, requires_grad=True)
    rows = grad_vs_k(
        _scalar_problem(a, x),
        lambda z: z.sum(),
        [1, 3],
        {"one_step": ih.OneStep()},
        same_k=ih.Unroll(),
    )
    one = torch.ones(2, dtype=F64)
    for row in rows:
        k_step = (1 - a ** row["K"]) / (1 - a)
        expected = float(one @ k_step / (one.norm() * k_step.norm()))
        assert row["cosine_same_k"] == pytest.approx(expected, rel=1e-9)
    assert rows[0]["cosine_same_k"] == pytest.approx(1.0)  # K = 1: one-step is Unroll


def test_grad_vs_k_needs_something_to_differentiate() -> None:
    x = torch.ones(2, dtype=F64)
    with pytest.raises(ValueError, match="wrt="):
        grad_vs_k(_scalar_problem(torch.ones(2, dtype=F64) * 0.5, x), lambda z: z.sum(), [1])
