"""Every exception and warning the library raises or emits.

Errors: ``NonFiniteError`` (a NaN / inf value or gradient), ``ForwardSolveError``,
``BackwardSolveError`` and its subclasses ``NotFixedPointError`` (an at-fixed-point gradient
asked at a point that is not one) and ``NotPositiveDefiniteError`` (CG on an indefinite system),
``SecondOrderError`` (a derivative a mode cannot give), ``ExportError`` (an export that
would not compute what the layer computes). Warnings:
``ConvergenceWarning`` and its subclass ``NotFixedPointWarning``, ``ConditioningWarning``,
``BatchCouplingWarning`` (per-sample stopping met an ``f`` that couples the samples).
"""

from implicit_ham._core.errors import (
    BackwardSolveError,
    BatchCouplingWarning,
    ConditioningWarning,
    ConvergenceWarning,
    ExportError,
    ForwardSolveError,
    NonFiniteError,
    NotFixedPointError,
    NotFixedPointWarning,
    NotPositiveDefiniteError,
    SecondOrderError,
)

__all__ = [
    "BackwardSolveError",
    "BatchCouplingWarning",
    "ConditioningWarning",
    "ConvergenceWarning",
    "ExportError",
    "ForwardSolveError",
    "NonFiniteError",
    "NotFixedPointError",
    "NotFixedPointWarning",
    "NotPositiveDefiniteError",
    "SecondOrderError",
]
