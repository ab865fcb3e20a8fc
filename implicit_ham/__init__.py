"""implicit-ham: optimization layers with selectable forward solvers and backward modes."""

from .adjoints import (
    ADJOINTS,
    Adjoint,
    AtFixedPoint,
    Implicit,
    Neumann,
    OneStep,
    Phantom,
    ThroughIterations,
    Truncated,
    Unroll,
)
from .errors import ConvergenceWarning, NonFiniteError
from .fixed_point import FixedPointProblem, Solution, fixed_point
from .linear_solvers import (
    GMRES,
    LINEAR_SOLVERS,
    AdjointOperator,
    AndersonLinear,
    BroydenLinear,
    Dense,
    FixedPointLinear,
    LinearSolver,
)
from .solvers import SOLVERS, Anderson, Broyden, FixedPointIteration, Solver
from .stats import BackwardStats, SolverStats

register_solver = SOLVERS.register
register_adjoint = ADJOINTS.register
register_linear_solver = LINEAR_SOLVERS.register
make_solver = SOLVERS.make
make_adjoint = ADJOINTS.make
make_linear_solver = LINEAR_SOLVERS.make

__all__ = [
    "ADJOINTS",
    "GMRES",
    "LINEAR_SOLVERS",
    "SOLVERS",
    "Adjoint",
    "AdjointOperator",
    "Anderson",
    "AndersonLinear",
    "AtFixedPoint",
    "BackwardStats",
    "Broyden",
    "BroydenLinear",
    "ConvergenceWarning",
    "Dense",
    "FixedPointIteration",
    "FixedPointLinear",
    "FixedPointProblem",
    "Implicit",
    "LinearSolver",
    "Neumann",
    "NonFiniteError",
    "OneStep",
    "Phantom",
    "Solution",
    "Solver",
    "SolverStats",
    "ThroughIterations",
    "Truncated",
    "Unroll",
    "fixed_point",
    "make_adjoint",
    "make_linear_solver",
    "make_solver",
    "register_adjoint",
    "register_linear_solver",
    "register_solver",
]
