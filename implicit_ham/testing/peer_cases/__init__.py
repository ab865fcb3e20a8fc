"""The peers' own test cases, carried over as facts (problems, inputs, expected values,
tolerances; the code written anew) and run against this library's layers: Theseus, jaxopt,
optimistix and TorchOpt. Each module's docstring names the peer's test files and states the
facts; ``PeerCase.source`` names the test each case comes from; a case without a counterpart is
listed with its reason (``PeerCase.reason``, no body).

``all_cases()`` lists them all; ``run_cases(cases, minimizer=None)`` runs them into a
``ConformanceReport`` (check = the peer, problem = the case's name; a case without a
counterpart is a "not applicable" check whose detail is its reason). The tests in
``tests/peers/<peer>/`` and ``check_minimizer(..., suite="peers")`` run the same cases.
"""

from __future__ import annotations

from functools import partial

from implicit_ham.solvers.minimizers import Minimizer
from implicit_ham.testing.peer_cases import (
    jaxopt_fixed_point,
    jaxopt_least_squares,
    optimistix,
    theseus,
    torchopt,
)
from implicit_ham.testing.peer_cases.common import PeerCase
from implicit_ham.testing.report import Checker, ConformanceReport, NotApplicableError

PEERS = ("theseus", "jaxopt", "optimistix", "torchopt")
REPOSITORIES = {
    "theseus": "facebookresearch/theseus",
    "jaxopt": "google/jaxopt",
    "optimistix": "patrick-kidger/optimistix",
    "torchopt": "metaopt/torchopt",
}

__all__ = ["PEERS", "REPOSITORIES", "PeerCase", "all_cases", "run_case", "run_cases"]


def all_cases() -> list[PeerCase]:
    """Every peer case, ported and not applicable, in the order of ``PEERS``."""
    return (
        theseus.cases()
        + jaxopt_fixed_point.cases()
        + jaxopt_least_squares.cases()
        + optimistix.cases()
        + torchopt.cases()
    )


def run_case(case: PeerCase, minimizer: Minimizer | None = None) -> dict[str, float]:
    """Run one case (``minimizer`` replaces the peer's solver where the case takes one);
    raises ``NotApplicableError`` (with the reason) for a case without a counterpart, and
    ``CheckFailedError`` (with the numbers) when it fails."""
    if case.body is None:
        raise NotApplicableError(case.reason)
    if minimizer is not None and not case.takes_minimizer:
        raise NotApplicableError("the case does not take a minimizer")
    if minimizer is not None and case.loss_only and minimizer.needs_residuals:
        raise NotApplicableError("a general loss (minimize): the minimizer needs residuals")
    return case.body(minimizer)


def run_cases(
    cases: list[PeerCase], minimizer: Minimizer | None = None, *, fail_fast: bool = False
) -> ConformanceReport:
    """Run ``cases`` into a report (check = the peer, problem = the case's name)."""
    name = "peer cases" if minimizer is None else repr(minimizer)
    checker = Checker(name, fail_fast)
    for case in cases:
        checker.run(case.peer, case.name, partial(run_case, case, minimizer))
    return checker.finish()
