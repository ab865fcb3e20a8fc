"""implicit-ham: optimization layers with selectable forward solvers and backward modes."""

from . import diagnostics, tracking
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
from .decompositions import (
    CD,
    DECOMPOSITIONS,
    NMF,
    SVD,
    VQ,
    Decomposition,
    NormalizedNMF,
    get_decomposition,
    register_decomposition,
)
from .errors import (
    BackwardSolveError,
    ConditioningWarning,
    ConvergenceWarning,
    ForwardSolveError,
    NonFiniteError,
    NotFixedPointError,
    NotFixedPointWarning,
    SecondOrderError,
)
from .fixed_point import FixedPointProblem, Solution, fixed_point
from .linear_solvers import (
    GMRES,
    LINEAR_SOLVERS,
    AdjointOperator,
    AndersonLinear,
    BroydenLinear,
    Dense,
    FixedPointLinear,
    LinearSolve,
    LinearSolver,
)
from .modules import (
    Hamburger,
    IdentityContext,
    SDPAttention2d,
    SelfAttention2d,
    context_names,
    make_context,
)
from .solvers import (
    SOLVERS,
    Anderson,
    Broyden,
    FixedPointIteration,
    Solver,
    TorchDEQAnderson,
    TorchDEQBroyden,
)
from .stats import BackwardStats, SolverStats

register_solver = SOLVERS.register
register_adjoint = ADJOINTS.register
register_linear_solver = LINEAR_SOLVERS.register
make_solver = SOLVERS.make
make_adjoint = ADJOINTS.make
make_linear_solver = LINEAR_SOLVERS.make

__all__ = [
    "ADJOINTS",
    "CD",
    "DECOMPOSITIONS",
    "GMRES",
    "LINEAR_SOLVERS",
    "NMF",
    "SOLVERS",
    "SVD",
    "VQ",
    "Adjoint",
    "AdjointOperator",
    "Anderson",
    "AndersonLinear",
    "AtFixedPoint",
    "BackwardSolveError",
    "BackwardStats",
    "Broyden",
    "BroydenLinear",
    "ConditioningWarning",
    "ConvergenceWarning",
    "Decomposition",
    "Dense",
    "FixedPointIteration",
    "FixedPointLinear",
    "FixedPointProblem",
    "ForwardSolveError",
    "Hamburger",
    "IdentityContext",
    "Implicit",
    "LinearSolve",
    "LinearSolver",
    "Neumann",
    "NonFiniteError",
    "NormalizedNMF",
    "NotFixedPointError",
    "NotFixedPointWarning",
    "OneStep",
    "Phantom",
    "SDPAttention2d",
    "SecondOrderError",
    "SelfAttention2d",
    "Solution",
    "Solver",
    "SolverStats",
    "ThroughIterations",
    "TorchDEQAnderson",
    "TorchDEQBroyden",
    "Truncated",
    "Unroll",
    "context_names",
    "diagnostics",
    "fixed_point",
    "get_decomposition",
    "make_adjoint",
    "make_context",
    "make_linear_solver",
    "make_solver",
    "register_adjoint",
    "register_decomposition",
    "register_linear_solver",
    "register_solver",
    "tracking",
]
