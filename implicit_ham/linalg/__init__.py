"""Linear solvers of the backward pass, ``A^T g = v`` with ``A = I - J`` (fixed points) or
``dg/dz`` / the Hessian (roots, minima), seen through ``AdjointOperator`` products only.

``Auto`` (the default: ``Dense`` / ``PerSampleDense`` for small systems, GMRES above),
``GMRES``, ``CG`` (symmetric positive-definite systems), ``Dense`` and ``PerSampleDense``
(materialised, exact, report the condition number), and the iterations of ``g <- J^T g + v``:
``FixedPointSolve`` (the Neumann series), ``AndersonSolve`` and ``BroydenSolve`` (native).
``arnoldi_dominant`` / ``lanczos_extremes`` share GMRES's Arnoldi process (the diagnostics
use them).
"""

from implicit_ham.linalg.auto import Auto
from implicit_ham.linalg.dense import Dense, PerSampleDense
from implicit_ham.linalg.iterative import AndersonSolve, BroydenSolve, FixedPointSolve
from implicit_ham.linalg.krylov import CG, GMRES, arnoldi_dominant, lanczos_extremes
from implicit_ham.linalg.operator import (
    LINEAR_SOLVERS,
    AdjointOperator,
    LinearSolve,
    LinearSolver,
    make_linear_solver,
    register_linear_solver,
)

__all__ = [
    "CG",
    "GMRES",
    "LINEAR_SOLVERS",
    "AdjointOperator",
    "AndersonSolve",
    "Auto",
    "BroydenSolve",
    "Dense",
    "FixedPointSolve",
    "LinearSolve",
    "LinearSolver",
    "PerSampleDense",
    "arnoldi_dominant",
    "lanczos_extremes",
    "make_linear_solver",
    "register_linear_solver",
]
