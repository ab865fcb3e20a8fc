"""The conformance kit's honesty checks: a solver's converged flag against the residual
recomputed at its value, value differences in eps with the grad-mode hint, and the short
``report.summary()``."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

import pytest
import torch

import implicit_ham as ih
from implicit_ham.testing import ConformanceError, check_solver
from implicit_ham.testing.convergence_checks import recomputed_residual
from implicit_ham.testing.problems import as_tuple, panel, tanh_problem


@dataclass(frozen=True)
class FakesConvergence(ih.plugins.FixedPointSolver):
    """Dishonest: 5 plain steps, then ``converged=True`` whatever the residual."""

    max_steps: int = 50
    tol: float | None = 1e-6

    def solve(self, f, z0, spec):
        inner = ih.FixedPointIteration(max_steps=5, tol=None, trace=True)
        z, stats = inner.solve(f, z0, spec)
        flag = torch.ones(spec.batch, dtype=torch.bool, device=z0[0].device)
        return z, dataclasses.replace(stats, converged=flag)


def _relax(z: torch.Tensor, fz: torch.Tensor, a: float) -> torch.Tensor:
    """``z + a (f(z) - z)``: in place by ``lerp_`` when autograd does not record (in-place ops
    cannot be recorded), else out of place as ``(1 - a) z + a f(z)``: one map, two kernels."""
    if torch.is_grad_enabled():
        return (1 - a) * z + a * fz
    return z.clone().lerp_(fz, a)


@dataclass(frozen=True)
class LerpISTA(ih.plugins.FixedPointSolver, ih.plugins.ReplaysIterates):
    """A relaxed (ISTA-like) iteration whose step kernel depends on the grad mode (``_relax``):
    the trailing ``grad_steps`` run with autograd recording, the others without, so the value
    moves by a few eps with the backward mode."""

    max_steps: int = 30
    tol: float | None = None
    relax: float = 0.7

    def solve(self, f, z0, spec):
        return self.solve_replaying(f, z0, spec, 0)

    def solve_replaying(self, f, z0, spec, grad_steps):
        grad_steps = min(grad_steps, self.max_steps)

        def step(z):
            return tuple(_relax(t, u, self.relax) for t, u in zip(z, f(z), strict=True))

        z = z0
        if grad_steps < self.max_steps:
            with torch.no_grad():
                for _ in range(self.max_steps - grad_steps):
                    z = step(z)
            z = tuple(t.detach() for t in z)
        for _ in range(grad_steps):
            z = step(z)
        res = torch.zeros(1, spec.batch, dtype=z0[0].dtype)
        return z, ih.plugins.SolverStats(self.name, self.max_steps, res, res[0], res[0], None)


@dataclass(frozen=True)
class GradStepsLeak(ih.FixedPointIteration):
    """Broken by logic: the value moves with grad_steps even without autograd."""

    def solve_replaying(self, f, z0, spec, grad_steps):
        z, stats = super().solve_replaying(f, z0, spec, grad_steps)
        return tuple(t + 1e-3 * min(grad_steps, self.max_steps) for t in z), stats


def test_a_solver_that_fakes_convergence_fails_with_the_recomputed_residual() -> None:
    with pytest.raises(ConformanceError, match="converged_flag_honest") as info:
        check_solver(FakesConvergence())
    message = str(info.value)
    assert "reports converged=True after 5 steps" in message
    assert "dishonest" in message
    assert re.search(r"recomputed_residual=5\.3\d\de-04", message)
    report = check_solver(FakesConvergence(), fail_fast=False)
    first = next(r for r in report.failed if r.check == "converged_flag_honest")
    claimed = first.measured["recomputed_residual"]
    # independent reference: 5 plain steps of the same map, the residual at that point
    problem = tanh_problem("tanh_f64", torch.float64, batch=3)
    z = problem.iterate(5)
    with torch.no_grad():
        fz = problem.step(z)
    rel = ((fz[0] - z[0]).norm(dim=1) / fz[0].norm(dim=1)).max()
    assert claimed == pytest.approx(float(rel), rel=1e-6)
    assert claimed > 1e-4  # orders of magnitude above its tol=1e-6


@pytest.mark.parametrize("name", ["fixed_point", "anderson", "broyden"])
def test_the_library_solvers_flags_are_honest(name: str) -> None:
    report = check_solver(ih.plugins.SOLVERS.get(name)())
    passed = [r for r in report.passed if r.check == "converged_flag_honest"]
    assert len(passed) == 5  # every non-empty problem; empty_f64 is skipped
    assert all(r.measured["samples_claimed"] > 0 for r in passed)  # the check bit


def test_the_recomputed_residual_is_the_plain_formula() -> None:
    problem = tanh_problem("tanh_f64", torch.float64, batch=3)
    z = problem.iterate(3)
    fz = problem.step(z)
    diff = fz[0] - z[0]
    ref_abs = torch.sqrt((diff**2).sum(1))
    assert torch.allclose(recomputed_residual(problem, z, "abs"), ref_abs, rtol=1e-12)
    ref_rel = ref_abs / torch.sqrt((fz[0] ** 2).sum(1))
    assert torch.allclose(recomputed_residual(problem, z, "rel"), ref_rel, rtol=1e-12)


def test_a_grad_mode_kernel_difference_is_reported_in_eps_with_the_hint() -> None:
    report = check_solver(LerpISTA(), fail_fast=False)
    failures = [r for r in report.failed if r.check == "value_independent_of_adjoint"]
    assert failures, report.summary()
    for r in failures:
        assert 0 < r.measured["diff_in_eps"] <= 64  # a last-bits difference
        eps = torch.finfo(torch.float32 if r.problem.endswith("f32") else torch.float64).eps
        assert r.measured["diff_in_eps"] == pytest.approx(r.measured["max_abs_diff"] / eps)
        assert "kernel difference between grad and no-grad mode" in r.detail
        assert "the solver's own step does" in r.detail
    # the independent measurement, outside the kit: the first reported pair of backward modes
    # run by hand on the same problem (which problems show a last-bits difference depends on
    # the machine's kernels, so the pair is taken from the report)
    first = failures[0]
    problem = next(p for p in panel() if p.name == first.problem)
    modes = re.search(r"under (\w+) differs from the value under (\w+)", first.detail)
    assert modes is not None, first.detail
    a, b = (
        as_tuple(ih.fixed_point(problem.f, problem.z0, *problem.args, solver=LerpISTA(),
                                adjoint=ih.plugins.ADJOINTS.get(name)()).value)
        for name in modes.groups()
    )  # fmt: skip
    diff = max(float((x - y).detach().abs().max()) for x, y in zip(a, b, strict=True))
    assert first.measured["max_abs_diff"] == diff


def test_a_logic_dependence_on_grad_steps_gets_no_kernel_hint() -> None:
    report = check_solver(GradStepsLeak(), fail_fast=False)
    failures = [r for r in report.failed if r.check == "value_independent_of_adjoint"]
    assert failures
    assert all("kernel difference" not in r.detail for r in failures)
    assert all(r.measured["diff_in_eps"] > 1e9 for r in failures if "f64" in r.problem)


def test_the_summary_counts_and_groups_failures_the_details_list_every_check() -> None:
    report = check_solver(FakesConvergence(), fail_fast=False)
    summary = report.summary()
    head = summary.splitlines()[0]
    assert head == (
        f"{report.plugin}: {len(report.results)} checks, {len(report.passed)} passed, "
        f"{len(report.failed)} failed, {len(report.skipped)} skipped (not checked), "
        f"{len(report.not_applicable)} not applicable; ok=False"
    )
    by_check = report.failures_by_check()
    assert by_check["converged_flag_honest"] == [
        "tanh_f64",
        "tuple_f64",
        "batch_f64",
        "noncontig_f64",
        "tanh_f32",
    ]
    assert "  converged_flag_honest: 5 (tanh_f64, tuple_f64, batch_f64" in summary
    not_applicable = {r.check for r in report.not_applicable}  # e.g. the empty batch's
    assert "not applicable (by design):" in summary and not report.skipped
    assert len(summary.splitlines()) == 3 + 2 * len(by_check) + 2 * len(not_applicable)
    assert len(report.details().splitlines()) == len(report.results)


def test_honest_solver_as_given_is_checked_too() -> None:
    """A solver with its own tolerance is checked as given and tightened: both pass for
    FixedPointIteration, and the value check accepts it."""
    solver = ih.FixedPointIteration(max_steps=200, tol=1e-10)
    report = check_solver(solver)
    assert report.ok
    problem = tanh_problem("tanh_f64", torch.float64, batch=3)
    sol = ih.fixed_point(problem.f, problem.z0, *problem.args, solver=solver)
    assert bool(sol.stats.converged.all())
    assert float(recomputed_residual(problem, as_tuple(sol.value), "rel").max()) <= 1e-10
