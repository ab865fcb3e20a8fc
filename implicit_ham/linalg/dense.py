"""``Dense``: the backward linear solve by materialising the system (M vector-Jacobian products)
and solving it exactly, with its condition number κ as a by-product.

For small states and as the reference the iterative solvers are checked against; ``max_size``
bounds M = B * N (the matrix is M x M). Under ``torch.func.vmap`` or while compiling it solves
without value-dependent checks; otherwise a non-finite system returns a NaN vector (the caller
applies the policy) and a singular one raises ``NonFiniteError``.
"""


from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from implicit_ham._core.errors import NonFiniteError
from implicit_ham._core.transforms import host_checks
from implicit_ham.linalg.operator import LINEAR_SOLVERS, AdjointOperator, LinearSolve, LinearSolver


@LINEAR_SOLVERS.register("dense")
@dataclass(frozen=True)
class Dense(LinearSolver):
    """Materialise ``I - J^T`` (M VJPs) and solve it exactly; reports κ(I - J).

    For small problems and as a reference. ``max_size`` bounds M (the matrix is M x M).
    """

    max_size: int = 4096
    iterative: ClassVar[bool] = False

    def solve(
        self, op: AdjointOperator, v: Tensor, max_steps: int, tol: float
    ) -> LinearSolve:
        if op.size > self.max_size:
            raise ValueError(
                f"Dense: the state has M={op.size} entries (batch included), above "
                f"max_size={self.max_size}; use linear_solver='gmres' or raise max_size"
            )
        eye = torch.eye(op.size, dtype=v.dtype, device=v.device)
        system = op.system_matrix(eye)
        if not host_checks():  # under vmap / while compiling: no value-dependent branches
            return LinearSolve(torch.linalg.solve(system, v), op.size, None)
        if not bool(torch.isfinite(system).all()):
            return LinearSolve(torch.full_like(v, float("nan")), op.size, None)
        cond = float(torch.linalg.cond(system.detach()))
        try:
            g = torch.linalg.solve(system, v)
        except torch.linalg.LinAlgError as err:
            raise NonFiniteError(
                f"Dense: the system {op.label} is singular (condition number {cond:.3e}); the "
                "solution is not isolated (e.g. NMF's scaling symmetry). Use a damped / "
                "regularised map or problem."
            ) from err
        return LinearSolve(g, op.size, cond)

