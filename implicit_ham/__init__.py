"""implicit-ham: optimization layers with selectable forward solvers and backward modes."""

from implicit_ham import diagnostics, tracking
from implicit_ham.adjoints import ADJOINTS, Adjoint, AtFixedPoint, Implicit, Neumann, OneStep, Phantom, ThroughIterations, Truncated, Unroll
from implicit_ham.decompositions import CD, DECOMPOSITIONS, NMF, SVD, VQ, Decomposition, NormalizedNMF, RidgeCD, RidgeNMF, get_decomposition, register_decomposition
from implicit_ham.errors import BackwardSolveError, ConditioningWarning, ConvergenceWarning, ForwardSolveError, NonFiniteError, NotFixedPointError, NotFixedPointWarning, NotPositiveDefiniteError, SecondOrderError
from implicit_ham.fixed_point import FixedPointProblem, Solution, fixed_point
from implicit_ham.linear_solvers import CG, GMRES, LINEAR_SOLVERS, AdjointOperator, AndersonLinear, BroydenLinear, Dense, FixedPointLinear, LinearSolve, LinearSolver
from implicit_ham.minimize import least_squares, minimize
from implicit_ham.minimizers import LBFGS, MINIMIZERS, GaussNewton, GradientDescent, LevenbergMarquardt, Minimizer, NewtonCG
from implicit_ham.modules import Hamburger, IdentityContext, SDPAttention2d, SelfAttention2d, context_names, make_context
from implicit_ham.projections import CONSTRAINTS, Box, Constraint, NonNegative
from implicit_ham.root import ROOT_SOLVERS, Newton, RootSolver, root
from implicit_ham.second_order import SecondOrder
from implicit_ham.solvers import SOLVERS, Anderson, Broyden, FixedPointIteration, Solver
from implicit_ham.stats import BackwardStats, SolverStats
from implicit_ham.torchdeq_solvers import TorchDEQAnderson, TorchDEQBroyden

register_solver = SOLVERS.register
register_adjoint = ADJOINTS.register
register_linear_solver = LINEAR_SOLVERS.register
make_solver = SOLVERS.make
make_adjoint = ADJOINTS.make
make_linear_solver = LINEAR_SOLVERS.make
register_root_solver = ROOT_SOLVERS.register
register_minimizer = MINIMIZERS.register

__all__ = [
    "ADJOINTS",
    "CD",
    "CG",
    "CONSTRAINTS",
    "DECOMPOSITIONS",
    "GMRES",
    "LBFGS",
    "LINEAR_SOLVERS",
    "MINIMIZERS",
    "NMF",
    "ROOT_SOLVERS",
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
    "Box",
    "Broyden",
    "BroydenLinear",
    "ConditioningWarning",
    "Constraint",
    "ConvergenceWarning",
    "Decomposition",
    "Dense",
    "FixedPointIteration",
    "FixedPointLinear",
    "FixedPointProblem",
    "ForwardSolveError",
    "GaussNewton",
    "GradientDescent",
    "Hamburger",
    "IdentityContext",
    "Implicit",
    "LevenbergMarquardt",
    "LinearSolve",
    "LinearSolver",
    "Minimizer",
    "Neumann",
    "Newton",
    "NewtonCG",
    "NonFiniteError",
    "NonNegative",
    "NormalizedNMF",
    "NotFixedPointError",
    "NotFixedPointWarning",
    "NotPositiveDefiniteError",
    "OneStep",
    "Phantom",
    "RidgeCD",
    "RidgeNMF",
    "RootSolver",
    "SDPAttention2d",
    "SecondOrder",
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
    "least_squares",
    "make_adjoint",
    "make_context",
    "make_linear_solver",
    "make_solver",
    "minimize",
    "register_adjoint",
    "register_decomposition",
    "register_linear_solver",
    "register_minimizer",
    "register_root_solver",
    "register_solver",
    "root",
    "tracking",
]
