"""What a plug-in author needs: every registry with its ``make_*`` / ``register_*`` pair, the
base classes to derive from, and the pieces their methods receive and return.

A new forward solver derives from ``StepwiseSolver`` (``init`` / ``step``; the base runs the loop
and measures) or ``FixedPointSolver`` (a whole ``solve``; it declares ``ReplaysIterates`` when
its steps are plain steps of ``f`` it can rerun with gradient), a backward mode from ``Adjoint``
(``ThroughIterations`` or ``AtFixedPoint``), a linear solver from ``LinearSolver`` (it sees
``J^T`` as an ``AdjointOperator`` and returns a ``LinearSolve``), a root solver from
``RootSolver``, a minimizer from ``Minimizer``, a projection from ``Constraint``, a
decomposition from ``Decomposition``; ``StateSpec`` flattens states, ``SolverStats`` /
``BackwardStats`` are what solvers and backward passes report, ``SecondOrder`` is a mode's rule
for ``create_graph=True``. Hold a plug-in to the contract with ``implicit_ham.testing``.

A plug-in validates its options as the built-ins do, with errors that name the owner, the
option and the value: ``check_positive_int``, ``check_tolerance``, ``check_choice``; a registry
of its own is a ``Registry`` (``parameter_names`` lists what a registered class or function
accepts).
"""

from implicit_ham._core.registry import Registry, parameter_names
from implicit_ham._core.state import StateSpec
from implicit_ham._core.stats import BackwardStats, SolverStats
from implicit_ham._core.validation import check_choice, check_positive_int, check_tolerance
from implicit_ham.adjoints import (
    ADJOINTS,
    Adjoint,
    AtFixedPoint,
    SecondOrder,
    ThroughIterations,
    find_implicit_layers,
    make_adjoint,
    register_adjoint,
)
from implicit_ham.decompositions import (
    DECOMPOSITIONS,
    Decomposition,
    make_decomposition,
    register_decomposition,
)
from implicit_ham.linalg import (
    LINEAR_SOLVERS,
    AdjointOperator,
    LinearSolve,
    LinearSolver,
    make_linear_solver,
    register_linear_solver,
)
from implicit_ham.nn import CONTEXTS, context_names, make_context, register_context
from implicit_ham.solvers import (
    CONSTRAINTS,
    MINIMIZERS,
    ROOT_SOLVERS,
    SOLVERS,
    Constraint,
    FixedPointSolver,
    Minimizer,
    ReplaysIterates,
    ReplaysSteps,
    RootSolver,
    StepwiseSolver,
    make_constraint,
    make_minimizer,
    make_root_solver,
    make_solver,
    register_constraint,
    register_minimizer,
    register_root_solver,
    register_solver,
)

__all__ = [
    "ADJOINTS",
    "CONSTRAINTS",
    "CONTEXTS",
    "DECOMPOSITIONS",
    "LINEAR_SOLVERS",
    "MINIMIZERS",
    "ROOT_SOLVERS",
    "SOLVERS",
    "Adjoint",
    "AdjointOperator",
    "AtFixedPoint",
    "BackwardStats",
    "Constraint",
    "Decomposition",
    "FixedPointSolver",
    "LinearSolve",
    "LinearSolver",
    "Minimizer",
    "Registry",
    "ReplaysIterates",
    "ReplaysSteps",
    "RootSolver",
    "SecondOrder",
    "SolverStats",
    "StateSpec",
    "StepwiseSolver",
    "ThroughIterations",
    "check_choice",
    "check_positive_int",
    "check_tolerance",
    "context_names",
    "find_implicit_layers",
    "make_adjoint",
    "make_constraint",
    "make_context",
    "make_decomposition",
    "make_linear_solver",
    "make_minimizer",
    "make_root_solver",
    "make_solver",
    "parameter_names",
    "register_adjoint",
    "register_constraint",
    "register_context",
    "register_decomposition",
    "register_linear_solver",
    "register_minimizer",
    "register_root_solver",
    "register_solver",
]
