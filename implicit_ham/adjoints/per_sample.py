"""``PerSampleDense`` (defined in ``implicit_ham.linalg.dense``) and ``PerSampleCG``: the
implicit backward solve of B independent problems, in O(B) work.

For a batch of independent problems (``least_squares``' default), the system of the implicit
backward pass (the Hessian of the summed objective, or ``dg/dz``) is block diagonal with one
N x N block per sample. Its B blocks come out of N products with the whole batch: the product
with ``e_j`` placed in every sample at once gives column j of every block. Then B small
dense solves (``torch.linalg.solve_ex``, batched). The caller (``finish_backward``) checks the
true residual of the whole system afterwards, so a system that is not block diagonal (coupled
samples) is reported, never silently mis-solved. ``PerSampleCG`` runs CG on the B blocks at
once (Hessian-vector products with the whole batch), each sample stopping on its own residual:
``minimize``'s default for B > 1 independent problems.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from implicit_ham._core.errors import NotPositiveDefiniteError
from implicit_ham.linalg.dense import PerSampleDense
from implicit_ham.linalg.operator import AdjointOperator, LinearSolve, LinearSolver

__all__ = ["PerSampleCG", "PerSampleDense"]


@dataclass(frozen=True)
class PerSampleCG(LinearSolver):
    """Conjugate gradients on each of the B diagonal blocks of a block-diagonal symmetric
    positive-definite system (the Hessian of B independent problems), all at once: every
    sample has its own step sizes and stops on its own residual, ``||r_b|| <= tol ||v_b||``;
    a stopped sample's direction is zero, so it no longer moves and its products cost nothing
    to the others (the operator is applied to the whole batch). Each sample's iterates are then
    those of ``CG`` on its block alone. As ``CG``, a direction with curvature
    ``p_b^T A_b p_b <= curvature_tol ||p_b||^2`` raises ``NotPositiveDefiniteError``, naming the
    samples. One host read per step (the samples still running, the curvature test).

    Args:
        batch: B, the number of blocks (the system's size M must be a multiple of it).
        curvature_tol: as for ``CG``.
    """

    batch: int
    curvature_tol: float = 0.0
    requires_spd: ClassVar[bool] = True
    scalable: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if isinstance(self.batch, bool) or not isinstance(self.batch, int) or self.batch < 1:
            raise ValueError(f"PerSampleCG: batch must be an integer >= 1, got {self.batch!r}")

    def solve(self, op: AdjointOperator, v: Tensor, max_steps: int, tol: float) -> LinearSolve:
        if op.size % self.batch:
            raise ValueError(
                f"PerSampleCG: the system has {op.size} unknowns, not a multiple of "
                f"batch={self.batch}; use linear_solver='cg' (the whole system as one)"
            )
        r = v.reshape(self.batch, -1)
        x, p = torch.zeros_like(r), r
        rr = torch.linalg.vecdot(r, r)
        target = (tol * tol) * rr
        active = rr > target  # v_b = 0: g_b = 0 solves block b exactly
        steps = 0
        for step in range(1, max_steps + 1):
            if not bool(active.any()):
                break
            steps = step
            p = p * active[:, None]
            ap = op.apply(p.reshape(-1)).reshape_as(p)
            curvature = torch.linalg.vecdot(p, ap)
            bad = active & (curvature <= self.curvature_tol * torch.linalg.vecdot(p, p))
            finite, flat = torch.stack((torch.isfinite(curvature).all(), bad.any())).tolist()
            if not finite:
                return LinearSolve(torch.full_like(v, float("nan")), step, None)
            if flat:
                raise self._not_positive_definite(op, bad, step)
            alpha = torch.where(active, rr / torch.where(active, curvature, 1.0), 0.0)
            x = torch.addcmul(x, alpha[:, None], p)
            r = torch.addcmul(r, alpha[:, None], ap, value=-1.0)
            rr_next = torch.linalg.vecdot(r, r)
            active = active & (rr_next > target)
            beta = torch.where(active, rr_next / torch.where(active, rr, 1.0), 0.0)
            p = torch.addcmul(r, beta[:, None], p)
            rr = torch.where(active, rr_next, rr)
        return LinearSolve(x.reshape(-1), steps, None)

    def _not_positive_definite(
        self, op: AdjointOperator, bad: Tensor, step: int
    ) -> NotPositiveDefiniteError:
        """The error naming the samples (``bad``: (B,) bool) whose direction lacks curvature."""
        samples = torch.nonzero(bad).flatten().tolist()
        return NotPositiveDefiniteError(
            f"PerSampleCG: the system {op.label} is not positive definite for samples "
            f"{samples}: direction {step} has curvature p^T A p <= "
            f"{self.curvature_tol:g} ||p||^2. CG needs a symmetric positive-definite "
            "system (a strict minimum); use linear_solver='gmres' or 'dense', or "
            "check that the point is a minimum."
        )
