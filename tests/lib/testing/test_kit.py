"""The conformance kit (``implicit_ham.testing``): every registered built-in passes it, and
broken plug-ins written here fail it with a ``ConformanceError`` naming the failed check."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from helpers.registry_names import builtin_names, builtin_params
from torch import Tensor

import implicit_ham as ih
from implicit_ham.testing import (
    ConformanceError,
    check_adjoint,
    check_decomposition,
    check_linear_solver,
    check_solver,
)

# --- every built-in, enumerated from the registries ------------------------------------------


def test_the_enumeration_covers_the_known_builtins() -> None:
    assert {"fixed_point", "anderson", "broyden"} <= set(builtin_names(ih.plugins.SOLVERS))
    assert {"unroll", "truncated", "one_step", "phantom", "implicit", "neumann"} <= set(
        builtin_names(ih.plugins.ADJOINTS)
    )
    assert {"gmres", "dense", "fixed_point", "anderson", "broyden"} <= set(
        builtin_names(ih.plugins.LINEAR_SOLVERS)
    )
    assert {"nmf", "vq", "cd", "svd", "nmf_normalized"} <= set(
        builtin_names(ih.plugins.DECOMPOSITIONS)
    )


@pytest.mark.parametrize("name", builtin_params(ih.plugins.SOLVERS))
def test_every_builtin_solver_conforms(name: str) -> None:
    report = check_solver(ih.plugins.SOLVERS.get(name)())
    assert report.ok and report.passed


@pytest.mark.parametrize("name", builtin_params(ih.plugins.ADJOINTS))
def test_every_builtin_adjoint_conforms(name: str) -> None:
    report = check_adjoint(ih.plugins.ADJOINTS.get(name)())
    assert report.ok and any(r.check.startswith("gradient_relation") for r in report.passed)


@pytest.mark.parametrize(
    "adjoint",
    [
        ih.Truncated(3),
        ih.Phantom(k=1, tau=1.0),
        ih.Phantom(k=3, tau=0.8),
        ih.Neumann(k=4, tau=0.8),
        ih.Implicit(linear_solver="dense", tol=1e-12, ridge=0.5),
    ],
    ids=repr,
)
def test_builtin_adjoint_variants_conform(adjoint: ih.plugins.Adjoint) -> None:
    assert check_adjoint(adjoint).ok


@pytest.mark.parametrize("name", builtin_params(ih.plugins.LINEAR_SOLVERS))
def test_every_builtin_linear_solver_conforms(name: str) -> None:
    assert check_linear_solver(ih.plugins.LINEAR_SOLVERS.get(name)()).ok


@pytest.mark.parametrize("name", builtin_params(ih.plugins.DECOMPOSITIONS))
def test_every_builtin_decomposition_conforms(name: str) -> None:
    assert check_decomposition(ih.plugins.DECOMPOSITIONS.get(name)).ok


def test_a_built_layer_instance_is_checked_as_configured() -> None:
    layer = ih.CD(rank=3, steps=2, eval_steps=2, groups=2, beta=0.5)
    report = check_decomposition(layer)
    assert report.ok and "groups=2" in report.plugin


def test_vq_is_exempt_from_the_exact_unroll_check_with_its_reason() -> None:
    assert ih.VQ.exact_unroll is False
    report = check_decomposition(ih.VQ)
    assert "unroll_matches_finite_differences" not in {r.check for r in report.results}
    assert "gradient_under_unroll" in {r.check for r in report.passed}


def test_the_report_lists_the_measured_numbers() -> None:
    report = check_adjoint(ih.Unroll())
    worst = report.worst("unroll_matches_finite_differences", "rel_error")
    assert worst is not None and worst <= 1e-6
    assert "passed" in report.summary()


# --- broken plug-ins: the kit must catch each one --------------------------------------------


@dataclass(frozen=True)
class GradStepsLeak(ih.FixedPointIteration):
    """Broken: the value moves with the number of gradient-carrying steps."""

    def solve_replaying(self, f, z0, spec, grad_steps):
        z, stats = super().solve_replaying(f, z0, spec, grad_steps)
        return tuple(t + 1e-3 * min(grad_steps, self.max_steps) for t in z), stats


@dataclass(frozen=True)
class DoubledOneStep(ih.OneStep):
    """Broken: the one-step gradient times 2 (the value is unchanged: 2t - t = t exactly)."""

    def run(self, f, z0, spec, solver):
        z, stats, log = super().run(f, z0, spec, solver)
        return tuple(2 * t - t.detach() for t in z), stats, log


@dataclass(frozen=True)
class ReturnsRightHandSide(ih.plugins.LinearSolver):
    """Broken: g = v, the one-step gradient instead of the solve."""

    def solve(self, op, v, max_steps, tol):
        return v.clone(), 0, None


class DetachedCoefNMF(ih.NMF):
    """Broken: the readout's coefficients do not depend on x (a dead input under OneStep)."""

    def compute_coef(self, x: Tensor, state: tuple[Tensor, Tensor]) -> Tensor:
        return super().compute_coef(x.detach(), state)


@dataclass(frozen=True)
class DelegatingImplicit(ih.plugins.Adjoint):
    """A new mode of unknown type that delegates to Implicit(Dense)."""

    def run(self, f, z0, spec, solver):
        return ih.Implicit(linear_solver="dense", tol=1e-12).run(f, z0, spec, solver)


def test_a_solver_whose_value_depends_on_grad_steps_fails() -> None:
    with pytest.raises(ConformanceError, match="value_independent_of_adjoint") as info:
        check_solver(GradStepsLeak())
    assert "GradStepsLeak" in str(info.value) and "max_abs_diff=" in str(info.value)


def test_an_adjoint_that_doubles_the_gradient_fails() -> None:
    with pytest.raises(ConformanceError, match=r"gradient_relation\[one_step\]") as info:
        check_adjoint(DoubledOneStep())
    assert "rel_error=1.000e+00" in str(info.value) and "tanh_f64" in str(info.value)


def test_a_linear_solver_returning_v_fails() -> None:
    with pytest.raises(ConformanceError, match="solve_matches_dense") as info:
        check_linear_solver(ReturnsRightHandSide())
    assert "ReturnsRightHandSide" in str(info.value) and "rel_error=" in str(info.value)


def test_a_decomposition_whose_compute_coef_detaches_x_fails() -> None:
    with pytest.raises(ConformanceError, match="gradient_under_default_mode"):
        check_decomposition(DetachedCoefNMF)


def test_collecting_every_failure_instead_of_stopping_at_the_first() -> None:
    report = check_decomposition(DetachedCoefNMF, fail_fast=False)
    failed = {r.check for r in report.failed}
    assert {"gradient_under_default_mode", "unroll_matches_finite_differences"} <= failed
    assert report.passed and not report.ok
    with pytest.raises(ConformanceError, match="2 conformance check"):
        report.raise_if_failed()


def test_an_unknown_mode_is_held_to_the_reference_it_names() -> None:
    alone = check_adjoint(DelegatingImplicit(), fail_fast=False)
    assert any(r.check.startswith("gradient_relation") for r in alone.skipped)
    assert not alone.ok  # its gradient was never compared
    named = check_adjoint(DelegatingImplicit(), reference=ih.Implicit(linear_solver="dense"))
    assert any(r.check == "gradient_relation[implicit]" for r in named.passed)
    with pytest.raises(ConformanceError, match="gradient_relation"):
        check_adjoint(DelegatingImplicit(), reference=ih.OneStep())


@dataclass(frozen=True)
class ScaledOneStep(ih.plugins.Adjoint):
    """A new mode of unknown type: the one-step gradient times ``scale`` (so wrong, unless a
    reference says what it must be)."""

    scale: float = 0.9

    def run(self, f, z0, spec, solver):
        z, stats, log = ih.OneStep().run(f, z0, spec, solver)
        scaled = tuple(t + (self.scale - 1) * (t - t.detach()) for t in z)  # same value
        return scaled, stats, log


def test_a_mode_whose_gradient_was_never_compared_is_not_ok() -> None:
    with pytest.raises(ConformanceError, match=r"could not run.*\n.*gradient_relation") as info:
        check_adjoint(ScaledOneStep())  # the default fail_fast raises at the end
    assert "allow_skips={'gradient_relation', 'second_derivative_or_refusal'}" in str(info.value)
    report = check_adjoint(ScaledOneStep(), fail_fast=False)
    assert not report.ok and not report.failed
    assert {r.check for r in report.unchecked} == {
        "gradient_relation[ScaledOneStep]",
        "second_derivative_or_refusal",
    }
    summary = report.summary()
    assert summary.splitlines()[0].endswith("5 skipped (not checked), 1 not applicable; ok=False")
    assert "not checked (ok is False until they run" in summary
    assert "gradient_relation[ScaledOneStep]: 4 (tanh_f64, tuple_f64, batch_f64, noncont" in summary
    with pytest.raises(ConformanceError, match="could not run"):
        report.raise_if_failed()
    accepted = check_adjoint(
        ScaledOneStep(), allow_skips={"gradient_relation", "second_derivative_or_refusal"}
    )
    assert accepted.ok and len(accepted.skipped) == 5
    assert "not checked, accepted by allow_skips:" in accepted.summary()
    assert check_adjoint(ScaledOneStep(), allow_skips=True).ok
    with pytest.raises(ConformanceError, match=r"gradient_relation\[one_step\]"):
        check_adjoint(ScaledOneStep(), reference=ih.OneStep())  # compared: 10% off


@dataclass(frozen=True)
class AlwaysConverged(ih.FixedPointIteration):
    """Broken: reports every sample converged even without a tolerance."""

    def solve_replaying(self, f, z0, spec, grad_steps):
        z, stats = super().solve_replaying(f, z0, spec, grad_steps)
        if self.tol is None:
            batch = z[0].shape[0]
            stats = dataclasses.replace(stats, converged=torch.ones(batch, dtype=torch.bool))
        return z, stats


def test_a_converged_flag_without_a_tolerance_fails() -> None:
    with pytest.raises(ConformanceError, match="converged_none_without_tolerance") as info:
        check_solver(AlwaysConverged())
    assert "has tol=None but reports converged=a torch.bool tensor" in str(info.value)


def test_a_crash_inside_a_plugin_is_a_named_failure() -> None:
    @dataclass(frozen=True)
    class Crashing(ih.FixedPointIteration):
        def solve_replaying(self, f, z0, spec, grad_steps):
            raise RuntimeError("boom")

    with pytest.raises(ConformanceError, match=r"runs_under_every_mode.*RuntimeError: boom"):
        check_solver(Crashing())


def test_the_kit_refuses_the_wrong_kind_of_plugin() -> None:
    with pytest.raises(TypeError, match=r"ih\.plugins\.FixedPointSolver"):
        check_solver(ih.OneStep())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Decomposition"):
        check_decomposition(torch.nn.Linear)  # type: ignore[arg-type]


def test_the_plugin_authors_example_in_the_docs_runs() -> None:
    text = (Path(__file__).resolve().parents[3] / "docs" / "conformance.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    namespace: dict[str, object] = {}
    exec(compile(blocks[0], "docs/conformance.md", "exec"), namespace)
    exec(compile(blocks[1], "docs/conformance.md", "exec"), namespace)
    namespace["test_my_solver_conforms"]()  # type: ignore[operator]


class ShiftedSVD(ih.SVD):
    """A decomposition with a learnable parameter inside its step (``dead``: detached there)."""

    def __init__(self, rank: int = 2, *, dead: bool = False, **kwargs) -> None:
        super().__init__(rank, **kwargs)
        self.shift = torch.nn.Parameter(torch.tensor(0.5))
        self.dead = dead

    def step(self, x: Tensor, state: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        return super().step(x + (self.shift.detach() if self.dead else self.shift), state)


def test_a_parameter_the_unrolled_gradient_never_reaches_fails() -> None:
    assert check_decomposition(ShiftedSVD(rank=2, steps=3)).ok
    with pytest.raises(ConformanceError, match=r"gradient_under_unroll.*gradient of shift"):
        check_decomposition(ShiftedSVD(rank=2, steps=3, dead=True))


def test_the_kit_leaves_the_global_random_state_alone() -> None:
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    check_decomposition(ih.NMF)
    assert torch.equal(torch.rand(3), expected)
