"""The conformance kit: hold a plug-in (solver, backward mode, linear solver, decomposition,
root solver, minimizer) to
the library's contract on a panel of small problems. See docs/conformance.md.

Usage (in a plug-in's own test suite; pytest is not required)::

    from implicit_ham.testing import check_solver

    def test_my_solver_conforms():
        check_solver(MySolver())            # ConformanceError (an AssertionError) on failure

    report = check_solver(MySolver(), fail_fast=False)   # run every check, collect failures
    text = report.summary()                  # counts, failures by check (details(): every check)
"""

from implicit_ham.testing.adjoint_checks import check_adjoint
from implicit_ham.testing.decomposition_checks import check_decomposition
from implicit_ham.testing.linear_solver_checks import check_linear_solver
from implicit_ham.testing.optimization_checks import check_minimizer, check_root_solver
from implicit_ham.testing.problems import Problem, panel
from implicit_ham.testing.report import CheckResult, ConformanceError, ConformanceReport
from implicit_ham.testing.solver_checks import check_solver

__all__ = [
    "CheckResult",
    "ConformanceError",
    "ConformanceReport",
    "Problem",
    "check_adjoint",
    "check_decomposition",
    "check_linear_solver",
    "check_minimizer",
    "check_root_solver",
    "check_solver",
    "panel",
]
