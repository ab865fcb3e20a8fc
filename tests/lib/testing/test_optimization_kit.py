"""The conformance kit extended to the root / argmin layers: every built-in root solver and
minimizer passes ``check_root_solver`` / ``check_minimizer``, and broken plug-ins fail them."""

from __future__ import annotations

import dataclasses

import pytest
from helpers.registry_names import builtin_params

import implicit_ham as ih
from implicit_ham.testing import ConformanceError, check_minimizer, check_root_solver


@pytest.mark.parametrize("name", builtin_params(ih.plugins.ROOT_SOLVERS))
def test_every_builtin_root_solver_conforms(name: str) -> None:
    report = check_root_solver(ih.plugins.ROOT_SOLVERS.get(name)())
    assert report.ok and any(r.check == "implicit_gradient_matches_ift" for r in report.passed)


def test_a_fixed_point_solver_on_z_minus_g_conforms() -> None:
    assert check_root_solver(ih.Broyden(max_steps=100, tol=1e-12, stop_mode="abs")).ok


@pytest.mark.parametrize("name", builtin_params(ih.plugins.MINIMIZERS))
def test_every_builtin_minimizer_conforms(name: str) -> None:
    report = check_minimizer(ih.plugins.MINIMIZERS.get(name)())
    assert report.ok and any(r.check == "implicit_gradient_matches_ift" for r in report.passed)


@dataclasses.dataclass(frozen=True)
class GiveUpEarly(ih.plugins.RootSolver):
    """A broken plug-in: one damped Newton step, then it returns."""

    max_steps: int = 1
    tol: float | None = None

    def solve(self, g, z0, spec):
        return ih.Newton(max_steps=1, tol=None, damping=0.5).solve(g, z0, spec)


@dataclasses.dataclass(frozen=True)
class ModeDependent(ih.GradientDescent):
    """A broken plug-in: it runs extra steps when a through-iteration mode asks for gradient."""

    def minimize_replaying(self, objective, z0, grad_steps):
        inner = dataclasses.replace(self, max_steps=self.max_steps + 5 * grad_steps, tol=None)
        return ih.GradientDescent.minimize_replaying(inner, objective, z0, grad_steps)


def test_broken_plugins_fail_with_the_check_named() -> None:
    with pytest.raises(ConformanceError, match="finds_the_root"):
        check_root_solver(GiveUpEarly())
    report = check_minimizer(ModeDependent(max_steps=300, tol=None), fail_fast=False)
    assert {r.check for r in report.failed} == {"value_independent_of_the_mode"}
    with pytest.raises(TypeError, match="Minimizer"):
        check_minimizer(ih.Newton())  # type: ignore[arg-type]
