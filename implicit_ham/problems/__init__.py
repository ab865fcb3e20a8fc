"""The entry points: ``fixed_point`` (``z = f(z, *args)``), ``root`` (``g(z, *args) = 0``),
``minimize`` / ``least_squares`` (argmin; ``module_state`` / ``call_module`` make a network's
weights the variable), each returning a ``Solution`` whose value carries the
gradient of the chosen backward mode."""

from implicit_ham.problems.correction import fixed_point_correction
from implicit_ham.problems.fixed_point import FixedPointProblem, Solution, fixed_point
from implicit_ham.problems.jacobian_penalty import jacobian_penalty
from implicit_ham.problems.least_squares import least_squares
from implicit_ham.problems.minimize import minimize
from implicit_ham.problems.parameters import call_module, module_state
from implicit_ham.problems.root import root

__all__ = [
    "FixedPointProblem",
    "Solution",
    "call_module",
    "fixed_point",
    "fixed_point_correction",
    "jacobian_penalty",
    "least_squares",
    "minimize",
    "module_state",
    "root",
]
