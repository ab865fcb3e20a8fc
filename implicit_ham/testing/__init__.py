"""The conformance kit: hold a plug-in (solver, backward mode, linear solver, decomposition) to
the library's contract on a panel of small problems. See docs/conformance.md."""

from .adjoint_checks import check_adjoint
from .decomposition_checks import check_decomposition
from .linear_solver_checks import check_linear_solver
from .problems import Problem, panel
from .report import CheckResult, ConformanceError, ConformanceReport
from .solver_checks import check_solver

__all__ = [
    "CheckResult",
    "ConformanceError",
    "ConformanceReport",
    "Problem",
    "check_adjoint",
    "check_decomposition",
    "check_linear_solver",
    "check_solver",
    "panel",
]
