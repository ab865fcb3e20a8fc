"""``Dense``: the backward linear solve by materialising the system (M vector-Jacobian products)
and solving it exactly, with its condition number κ as a by-product; ``PerSampleDense``: the
same for the B diagonal blocks of a block-diagonal (per-sample) system, from N products.

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

from implicit_ham._core.errors import NonFiniteError, NotPositiveDefiniteError
from implicit_ham._core.transforms import host_checks
from implicit_ham._core.validation import check_choice
from implicit_ham.linalg.operator import LINEAR_SOLVERS, AdjointOperator, LinearSolve, LinearSolver


@LINEAR_SOLVERS.register("dense")
@dataclass(frozen=True)
class Dense(LinearSolver):
    """Materialise ``I - J^T`` (M VJPs) and solve it exactly; reports κ(I - J).

    For small problems and as a reference. ``max_size`` bounds M (the matrix is M x M).
    ``positive_definite``: the system must be symmetric positive definite (a Hessian at a
    strict minimum, as ``CG`` requires): a non-positive eigenvalue of its symmetric part
    raises ``NotPositiveDefiniteError`` (``Auto`` sets it when its iterative solver is CG).
    ``singular``: what a singular system does: "raise" (``NonFiniteError``) or "nan" (a NaN
    vector, so that ``Auto`` goes on to its iterative solver, which may still find a solution
    of a consistent singular system, e.g. NMF's).
    """

    max_size: int = 4096
    positive_definite: bool = False
    singular: str = "raise"
    iterative: ClassVar[bool] = False

    def __post_init__(self) -> None:
        check_choice("Dense", "singular", self.singular, ("raise", "nan"))

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
        if self.positive_definite:
            check_positive_definite("Dense", system.detach()[None], op.label)
        cond = float(torch.linalg.cond(system.detach()))
        try:
            g = torch.linalg.solve(system, v)
        except torch.linalg.LinAlgError as err:
            if self.singular == "nan":
                return LinearSolve(torch.full_like(v, float("nan")), op.size, cond)
            raise NonFiniteError(
                f"Dense: the system {op.label} is singular (condition number {cond:.3e}); the "
                "solution is not isolated (e.g. NMF's scaling symmetry). Use a damped / "
                "regularised map or problem."
            ) from err
        return LinearSolve(g, op.size, cond)


@dataclass(frozen=True)
class PerSampleDense(LinearSolver):
    """Dense solves of the B diagonal blocks of a block-diagonal system (N products).

    Args:
        batch: B, the number of blocks (the system's size M must be a multiple of it).
        positive_definite: as for ``Dense``, per block.
    """

    batch: int
    positive_definite: bool = False
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
        if self.positive_definite:
            check_positive_definite("PerSampleDense", blocks.detach(), op.label)
        cond = float(torch.linalg.cond(blocks.detach()).max())
        return LinearSolve(solution.reshape(-1), n, cond)


def check_positive_definite(where: str, blocks: Tensor, label: str) -> None:
    """Raise ``NotPositiveDefiniteError`` unless the symmetric part of every (B, n, n) block
    has only positive eigenvalues, naming the samples and the smallest eigenvalue."""
    smallest = torch.linalg.eigvalsh(0.5 * (blocks + blocks.mT))[:, 0]
    bad = smallest <= 0
    if bool(bad.any()):
        samples = torch.nonzero(bad).flatten().tolist()
        raise NotPositiveDefiniteError(
            f"{where}: the system {label} is not positive definite for samples {samples}: "
            f"smallest eigenvalue λ_min = {float(smallest.min()):.3e}. The point is not a "
            "strict minimum (a saddle or a flat direction); its implicit gradient is not that "
            "of a minimum. Check the point, or pass Implicit(linear_solver='dense') to "
            "differentiate a stationary point."
        )
