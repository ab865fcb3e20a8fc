"""``PerSampleDense``: the implicit backward solve of B independent problems, in O(B) work.

For a batch of independent problems (``least_squares``' default), the system of the implicit
backward pass (the Hessian of the summed objective, or ``dg/dz``) is block diagonal with one
N x N block per sample. Its B blocks come out of N products with the whole batch: the product
with ``e_j`` placed in every sample at once gives column j of every block. Then B small
dense solves (``torch.linalg.solve_ex``, batched). The caller (``finish_backward``) checks the
true residual of the whole system afterwards, so a system that is not block diagonal (coupled
samples) is reported, never silently mis-solved.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from implicit_ham._core.transforms import host_checks
from implicit_ham.linalg.operator import AdjointOperator, LinearSolve, LinearSolver


@dataclass(frozen=True)
class PerSampleDense(LinearSolver):
    """Dense solves of the B diagonal blocks of a block-diagonal system (N products).

    Args:
        batch: B, the number of blocks (the system's size M must be a multiple of it).
    """

    batch: int
    iterative: ClassVar[bool] = False

    def __post_init__(self) -> None:
        if isinstance(self.batch, bool) or not isinstance(self.batch, int) or self.batch < 1:
            raise ValueError(f"PerSampleDense: batch must be an integer >= 1, got {self.batch!r}")

    def solve(self, op: AdjointOperator, v: Tensor, max_steps: int, tol: float) -> LinearSolve:
        if op.size % self.batch:
            raise ValueError(
                f"PerSampleDense: the system has {op.size} unknowns, not a multiple of "
                f"batch={self.batch}; use linear_solver='dense' or 'gmres'"
            )
        n = op.size // self.batch
        eye = torch.eye(n, dtype=v.dtype, device=v.device)
        rows = eye[:, None, :].expand(n, self.batch, n).reshape(n, op.size)
        if op.system_batched is not None:
            products = op.system_batched(rows)
        else:
            products = rows - op.vjp_batched(rows)
        # products[j] reshaped (B, n): row b is block b's (A^T) column j
        blocks = products.reshape(n, self.batch, n).permute(1, 2, 0)
        solution, info = torch.linalg.solve_ex(blocks, v.reshape(self.batch, n))
        if not host_checks():
            return LinearSolve(solution.reshape(-1), n, None)
        if bool((info != 0).any()) or not bool(torch.isfinite(blocks).all()):
            return LinearSolve(torch.full_like(v, float("nan")), n, None)
        cond = float(torch.linalg.cond(blocks.detach()).max())
        return LinearSolve(solution.reshape(-1), n, cond)
