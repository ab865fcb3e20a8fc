"""Backward modes: how a solution's gradient is defined.

Through the iterations: ``Unroll``, ``Truncated(k)``, ``OneStep`` (they choose how many trailing
solver steps carry gradient) and ``Phantom(k, tau)`` (damped steps from the solution). At the
fixed point: ``Implicit`` (a linear solve with a ``implicit_ham.linalg`` solver) and
``Neumann(k)``; ``PerSampleDense`` solves a block-diagonal (per-sample) system for
``Implicit``. ``SecondOrder`` is the rule a mode gives for ``create_graph=True``.
"""

from implicit_ham.adjoints.layers import find_implicit_layers
from implicit_ham.adjoints.modes import (
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
    make_adjoint,
    register_adjoint,
)
from implicit_ham.adjoints.per_sample import PerSampleCG, PerSampleDense
from implicit_ham.adjoints.second_order import SecondOrder

__all__ = [
    "ADJOINTS",
    "Adjoint",
    "AtFixedPoint",
    "Implicit",
    "Neumann",
    "OneStep",
    "PerSampleCG",
    "PerSampleDense",
    "Phantom",
    "SecondOrder",
    "ThroughIterations",
    "Truncated",
    "Unroll",
    "find_implicit_layers",
    "make_adjoint",
    "register_adjoint",
]
