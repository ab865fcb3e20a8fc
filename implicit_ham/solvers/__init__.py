"""Forward solvers.

Fixed points ``z = f(z)``: ``FixedPointIteration``, ``Anderson``, ``Broyden`` (native) and
torchdeq's ``TorchDEQAnderson`` / ``TorchDEQBroyden`` (the optional ``torchdeq`` extra, imported
when one is built); a plug-in written as ``init`` / ``step`` derives from ``StepwiseSolver``.
Roots ``g(z) = 0``: ``Newton``. Minima: ``GradientDescent`` (with a ``Constraint`` projection:
``NonNegative``, ``Box``), ``LBFGS``, ``NewtonCG``, ``GaussNewton``, ``LevenbergMarquardt``
(batched least squares, with a ``RobustLoss``).
"""

from implicit_ham.solvers.accelerated import Anderson, Broyden
from implicit_ham.solvers.base import (
    SOLVERS,
    FixedPointSolver,
    ReplaysIterates,
    make_solver,
    register_solver,
)
from implicit_ham.solvers.iteration import FixedPointIteration
from implicit_ham.solvers.least_squares import (
    GaussNewton,
    LeastSquaresStats,
    LevenbergMarquardt,
)
from implicit_ham.solvers.minimizers import (
    MINIMIZERS,
    GradientDescent,
    Minimizer,
    ReplaysSteps,
    make_minimizer,
    register_minimizer,
)
from implicit_ham.solvers.newton import (
    ROOT_SOLVERS,
    Newton,
    RootSolver,
    make_root_solver,
    register_root_solver,
)
from implicit_ham.solvers.projections import (
    CONSTRAINTS,
    Box,
    Constraint,
    NonNegative,
    make_constraint,
    register_constraint,
)
from implicit_ham.solvers.quasi_newton import LBFGS, NewtonCG
from implicit_ham.solvers.robust import LOSSES, RobustLoss
from implicit_ham.solvers.stepwise import StepwiseSolver
from implicit_ham.solvers.torchdeq import TorchDEQAnderson, TorchDEQBroyden

__all__ = [
    "CONSTRAINTS",
    "LBFGS",
    "LOSSES",
    "MINIMIZERS",
    "ROOT_SOLVERS",
    "SOLVERS",
    "Anderson",
    "Box",
    "Broyden",
    "Constraint",
    "FixedPointIteration",
    "FixedPointSolver",
    "GaussNewton",
    "GradientDescent",
    "LeastSquaresStats",
    "LevenbergMarquardt",
    "Minimizer",
    "Newton",
    "NewtonCG",
    "NonNegative",
    "ReplaysIterates",
    "ReplaysSteps",
    "RobustLoss",
    "RootSolver",
    "StepwiseSolver",
    "TorchDEQAnderson",
    "TorchDEQBroyden",
    "make_constraint",
    "make_minimizer",
    "make_root_solver",
    "make_solver",
    "register_constraint",
    "register_minimizer",
    "register_root_solver",
    "register_solver",
]
