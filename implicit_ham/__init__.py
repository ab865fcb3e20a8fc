"""implicit-ham: optimization layers with selectable forward solvers and backward modes.

The curated namespace: the entry points, the built-in solvers, backward modes, decompositions
and context modules, the errors users catch, and the sub-namespaces ``linalg`` (backward linear
solvers), ``plugins`` (registries and base classes), ``errors`` (every exception and warning),
``diagnostics``, ``reliability`` and ``testing`` (the conformance kit, imported on first use).
"""

from typing import Any

from implicit_ham import diagnostics, errors, linalg, nn, plugins, reliability
from implicit_ham._core.errors import (
    BatchCouplingWarning,
    ConditioningWarning,
    ConvergenceWarning,
    NonFiniteError,
    NotFixedPointError,
    NotFixedPointWarning,
)
from implicit_ham._core.stats import BackwardStats, SolverStats
from implicit_ham.adjoints import Implicit, Neumann, OneStep, Phantom, Truncated, Unroll
from implicit_ham.decompositions import (
    CD,
    NMF,
    SVD,
    VQ,
    Decomposition,
    NormalizedNMF,
    RidgeCD,
    RidgeNMF,
    make_decomposition,
    register_decomposition,
)
from implicit_ham.nn import (
    GlobalPoolContext,
    Hamburger,
    HamMixer,
    IdentityContext,
    LightHamHead,
    LinearAttentionMixer,
    SDPAMixer,
    SDPAttention2d,
    SelfAttention2d,
    make_context,
)
from implicit_ham.problems import (
    FixedPointProblem,
    Solution,
    call_module,
    fixed_point,
    fixed_point_correction,
    jacobian_penalty,
    least_squares,
    minimize,
    module_state,
    root,
)
from implicit_ham.solvers import (
    LBFGS,
    Anderson,
    Box,
    Broyden,
    FixedPointIteration,
    GaussNewton,
    GradientDescent,
    LeastSquaresStats,
    LevenbergMarquardt,
    Newton,
    NewtonCG,
    NonNegative,
    RobustLoss,
)

__all__ = [
    "CD",
    "LBFGS",
    "NMF",
    "SVD",
    "VQ",
    "Anderson",
    "BackwardStats",
    "BatchCouplingWarning",
    "Box",
    "Broyden",
    "ConditioningWarning",
    "ConvergenceWarning",
    "Decomposition",
    "FixedPointIteration",
    "FixedPointProblem",
    "GaussNewton",
    "GlobalPoolContext",
    "GradientDescent",
    "HamMixer",
    "Hamburger",
    "IdentityContext",
    "Implicit",
    "LeastSquaresStats",
    "LevenbergMarquardt",
    "LightHamHead",
    "LinearAttentionMixer",
    "Neumann",
    "Newton",
    "NewtonCG",
    "NonFiniteError",
    "NonNegative",
    "NormalizedNMF",
    "NotFixedPointError",
    "NotFixedPointWarning",
    "OneStep",
    "Phantom",
    "RidgeCD",
    "RidgeNMF",
    "RobustLoss",
    "SDPAMixer",
    "SDPAttention2d",
    "SelfAttention2d",
    "Solution",
    "SolverStats",
    "Truncated",
    "Unroll",
    "call_module",
    "diagnostics",
    "errors",
    "fixed_point",
    "fixed_point_correction",
    "jacobian_penalty",
    "least_squares",
    "linalg",
    "make_context",
    "make_decomposition",
    "minimize",
    "module_state",
    "nn",
    "plugins",
    "register_decomposition",
    "reliability",
    "root",
    "testing",
]


def __getattr__(name: str) -> Any:
    """``implicit_ham.testing`` is imported on first use (it is only needed by test suites)."""
    if name == "testing":
        import importlib

        return importlib.import_module("implicit_ham.testing")
    raise AttributeError(f"module 'implicit_ham' has no attribute {name!r}")
