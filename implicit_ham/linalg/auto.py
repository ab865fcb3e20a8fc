"""``Auto``: ``Implicit``'s default linear solver, dense for small systems, scaled Krylov
otherwise.

A residual can be small for a wrong answer: the relative residual of an ill-scaled system is
dominated by its largest rows, and a Krylov space of one step may already meet it (a curve fit
with b1 ~ 240 and b2 ~ 5e-4 has κ(Hessian) ~ 6e13; GMRES stopped after one step at a relative
residual of 2.7e-6 with a gradient 60x too small). A small system is therefore solved exactly:
materialised from its products and factorised, with κ exact. The choice, per backward pass, by
the size of the system (M = B * N unknowns, N per sample):

* ``N <= block_max`` with B > 1 samples: ``PerSampleDense`` (N products for all B blocks); its
  answer is only right when the samples are independent, so when its true residual misses the
  tolerance (samples coupled, e.g. by batch statistics) ``Implicit`` goes on to ``Dense`` if
  M <= dense_max, else to the iterative solver;
* ``M <= dense_max``: ``Dense`` (M products, exact κ, correct for coupled samples too);
* the iterative solver, last, whatever the size: after a dense answer that misses ``tol`` (a
  singular system, e.g. NMF's scaling symmetry, whose consistent right-hand side GMRES may
  still solve; or one too ill-conditioned for the working precision);
  the iterative solver is ``GMRES()`` by default (``CG`` / ``PerSampleCG`` for the Hessians of
  ``minimize``), and ``Implicit`` hands it the scaled system.

With a CG iterative solver (a minimum's Hessian) the dense solves check positive definiteness
as CG does (``NotPositiveDefiniteError`` at a saddle).

The thresholds are measured (``docs/backward-modes.md``, "Choosing the linear solver";
``experiments/benchmarks/dense_threshold.py``): on one sample the dense solve is faster than
GMRES up to M = 128 unknowns, on a batch of 64 the dense blocks up to N = 32 (about even
there, 2.2x slower at N = 64, where the N batched products outweigh GMRES's ~25).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from torch import Tensor

from implicit_ham._core.validation import check_nonnegative, check_positive_int
from implicit_ham.linalg.dense import Dense, PerSampleDense
from implicit_ham.linalg.operator import (
    LINEAR_SOLVERS,
    AdjointOperator,
    LinearSolve,
    LinearSolver,
    relative_residual,
)

DENSE_MAX = 128
BLOCK_MAX = 32


@LINEAR_SOLVERS.register("auto")
@dataclass(frozen=True)
class Auto(LinearSolver):
    """Dense for small systems, ``iterative_solver`` above (see the module docstring).

    Args:
        dense_max: the largest system (M = B * N unknowns) solved as one dense matrix.
        block_max: the largest number of unknowns per sample (N) solved as B dense blocks;
            0: never (the samples are coupled: one problem).
        iterative_solver: the solver for larger systems (or coupled samples), a
            ``LinearSolver`` or its name; default "gmres".
    """

    dense_max: int = DENSE_MAX
    block_max: int = BLOCK_MAX
    iterative_solver: LinearSolver | str = "gmres"
    iterative: ClassVar[bool] = True

    def __post_init__(self) -> None:
        check_positive_int("Auto", "dense_max", self.dense_max)
        check_nonnegative("Auto", "block_max", self.block_max, "no per-sample blocks")
        object.__setattr__(
            self, "iterative_solver", LINEAR_SOLVERS.resolve(self.iterative_solver, LinearSolver)
        )

    def choices(self, op: AdjointOperator) -> tuple[LinearSolver, ...]:
        fallback: LinearSolver = self.iterative_solver  # type: ignore[assignment]
        spd = fallback.requires_spd  # CG's contract (a minimum) holds for the dense solve too
        whole: tuple[LinearSolver, ...] = ()
        if op.size <= self.dense_max:
            whole = (self._dense(),)
        per_sample = op.batch > 1 and op.size % op.batch == 0
        if per_sample and op.size // op.batch <= self.block_max:
            whole = (PerSampleDense(op.batch, positive_definite=spd), *whole)
        return (*whole, fallback)

    def traced_choice(self, op: AdjointOperator) -> LinearSolver:
        """Without host checks (``torch.compile``) no residual can pick between the choices:
        the whole dense system where it is small enough (right for coupled samples too, unlike
        the per-sample blocks), else the iterative solver."""
        if op.size <= self.dense_max:
            return self._dense()
        return self.iterative_solver  # type: ignore[return-value]

    def _dense(self) -> Dense:
        """The whole system as one dense matrix (NaN where singular, so that the iterative
        solver may still solve a consistent singular system, e.g. NMF's)."""
        spd = self.iterative_solver.requires_spd  # type: ignore[union-attr]
        return Dense(max_size=self.dense_max, positive_definite=spd, singular="nan")

    def solve(self, op: AdjointOperator, v: Tensor, max_steps: int, tol: float) -> LinearSolve:
        """The first choice whose answer meets ``tol``, else the answer with the smallest
        residual, unscaled (``Implicit`` goes through ``choices`` itself, scaling the Krylov
        solves)."""
        steps, choices = 0, self.choices(op)
        best: tuple[float, LinearSolve] | None = None
        for chosen in choices:
            answer = chosen.solve(op, v, max_steps, tol)
            residual = relative_residual(op, v, answer.g)
            steps += answer.steps + 1
            if best is None or residual < best[0]:
                best = (residual, answer)
            if residual <= tol:
                break
        assert best is not None
        return LinearSolve(best[1].g, steps, best[1].cond)
