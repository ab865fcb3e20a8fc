"""``check_minimizer(..., suite="peers")`` and ``suite="mgh"``: a minimizer plug-in on the
peers' own cases (``peer_cases``, those that take a minimizer) and on the Moré-Garbow-Hillstrom
set (``mgh``).

* ``peers``: each case with the peer's solver replaced by the plug-in (check = the peer,
  problem = the case's name): the case's own assertion at the peer's tolerance. A case that
  minimises a general loss does not apply to a minimizer that needs residuals (not
  applicable, with that reason).
* ``mgh``: check ``solves_mgh_problem`` per problem, float64 from the paper's start:
  ``ih.least_squares`` (a minimizer that needs residuals) or ``ih.minimize`` of ``Σ r²``;
  solved is Moré & Wild's ``f - f* <= 1e-6 (f0 - f*)``; stopping at another minimum the paper
  states counts as solved here (``stated_minimum`` in the measured numbers says which). Even
  SciPy's methods miss some of the set (docs/peer_suites.md): run with ``fail_fast=False`` and
  read the report.
"""

from __future__ import annotations

import warnings
from collections.abc import Collection
from functools import partial

import torch

from implicit_ham.problems.least_squares import least_squares
from implicit_ham.problems.minimize import minimize
from implicit_ham.solvers.minimizers import Minimizer
from implicit_ham.testing.mgh import MGHProblem, problems, solved
from implicit_ham.testing.peer_cases import all_cases, run_case
from implicit_ham.testing.peer_cases.common import one
from implicit_ham.testing.report import Checker, ConformanceReport, require

MGH_TAU = 1e-6


def peer_suite(
    minimizer: Minimizer, fail_fast: bool, names: Collection[str] | None = None
) -> ConformanceReport:
    """The peers' cases that take a minimizer (those named in ``names``, default all), with
    ``minimizer`` (see the module docstring)."""
    checker = Checker(repr(minimizer), fail_fast)
    for case in all_cases():
        if case.takes_minimizer and (names is None or case.name in names):
            checker.run(case.peer, case.name, partial(run_case, case, minimizer))
    return checker.finish()


def _solve_mgh(problem: MGHProblem, minimizer: Minimizer) -> dict[str, float]:
    x0 = problem.start()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a miss is judged by f below, not by the warnings
        if minimizer.needs_residuals:
            value = one(least_squares(problem.residuals, x0, solver=minimizer))
        else:
            value = one(minimize(lambda x: problem.f(x), x0, solver=minimizer))
    f, f0 = float(problem.f(value.detach().to(torch.float64))), float(problem.f(x0))
    stated = (problem.fstar, *problem.local)
    hit = next((m for m in stated if solved(f, f0, m, MGH_TAU)), None)
    require(hit is not None, "did not reach a stated minimum", f=f, fstar=problem.fstar, f0=f0)
    assert hit is not None
    return {"f": f, "stated_minimum": hit}


def mgh_suite(
    minimizer: Minimizer, fail_fast: bool, names: Collection[str] | None = None
) -> ConformanceReport:
    """The MGH set (the problems named in ``names``, default all) with ``minimizer`` (see the
    module docstring)."""
    checker = Checker(repr(minimizer), fail_fast)
    for problem in problems():
        if names is not None and problem.name not in names:
            continue
        checker.run("solves_mgh_problem", problem.name, partial(_solve_mgh, problem, minimizer))
    return checker.finish()
