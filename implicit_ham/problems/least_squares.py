"""``least_squares``: the argmin layer of a (robust) sum of squares, by default over a batch
of independent problems, differentiated through its optimality condition.

``z* = argmin_z ½ C² Σ ρ(r(z)² / C²)`` (``½||r(z)||²`` for the default linear loss). With
``batch_coupled=False`` (the default) sample b's residuals depend on sample b's variables only:
the solvers work on B problems at once (per-sample Jacobians, batched normal equations,
per-sample line searches and stopping; ``implicit_ham.solvers.least_squares``), and the
default implicit backward pass solves B Hessian blocks (``PerSampleDense``), so the cost grows
linearly in B. ``batch_coupled=True`` treats the whole batch as one problem (residuals of any
shape, e.g. batch statistics), as ``minimize`` does.

The implicit gradient differentiates ``grad_z cost(z*, θ) = 0`` with the full Hessian of the
(robust) cost, not the Gauss-Newton approximation. ``Unroll`` / ``Truncated(k)`` /
``OneStep`` differentiate the solver's steps (see the solvers' module docstring: the inner
solves are in the graph, the step sizes and damping are chosen without gradient).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from implicit_ham._core.state import BoundStep, State, StateSpec
from implicit_ham.adjoints.conditions import Condition, differentiate, guarded_inputs
from implicit_ham.adjoints.modes import ADJOINTS, Adjoint, Implicit
from implicit_ham.linalg.auto import Auto
from implicit_ham.linalg.dense import PerSampleDense
from implicit_ham.linalg.krylov import CG
from implicit_ham.problems.fixed_point import Solution
from implicit_ham.problems.minimize import minimize
from implicit_ham.solvers.least_squares import GaussNewton, SumOfSquares, SumOfSquaresSolver
from implicit_ham.solvers.minimizers import MINIMIZERS, Minimizer
from implicit_ham.solvers.robust import RobustLoss

WHERE = "least_squares"
SCALED = "the scaled gradient Jᵀ W r / (||J||_F ||√W r||)"  # see LeastSquaresStats


def least_squares(
    residuals: Callable[..., Tensor],
    z0: Tensor | Sequence[Tensor],
    *args: Any,
    solver: Minimizer | str | None = None,
    adjoint: Adjoint | str | None = None,
    batch_coupled: bool = False,
    loss: RobustLoss | str = "linear",
    f_scale: float = 1.0,
) -> Solution:
    """``z* = argmin_z ½ C² Σ ρ(residuals(z, *args)² / C²)`` from ``z0``.

    Args:
        residuals: ``r(z, *args) -> Tensor``. Per sample (``batch_coupled=False``): shaped
            (B, ...), sample b's residuals depending on sample b of z only (checked once, on
            the first Jacobian, with one probe); for B = 1 any shape. Coupled: any shape.
        z0: the initial point, (B, ...) or a tuple of (B, ...) tensors sharing B and dtype.
        *args: extra inputs of ``residuals`` (the tensors the gradient must reach, or closed
            over).
        solver: ``GaussNewton()`` (default), ``LevenbergMarquardt()``, a name, or any other
            ``Minimizer`` (then ``minimize`` of the cost, the whole batch as one problem).
        adjoint: default ``Implicit`` with ``PerSampleDense`` blocks (coupled: ``Auto``,
            dense for a small Hessian, else scaled CG on the whole Hessian); any backward
            mode, ``Unroll`` / ``Truncated`` / ``OneStep`` included (through the
            Gauss-Newton / LM steps). An at-point mode's ``fixed_point_tol`` bounds the
            scaled gradient ``||Jᵀ W r|| / (||J||_F ||√W r||)``
            (a cosine, scale free; the default is ``max(1e-3, 30 sqrt(eps))``: float32's
            residuals round to about that when the fit is much better than the data's size).
        batch_coupled: solve the batch as one problem (see the module docstring).
        loss: "linear" (default), "huber", "soft_l1", "cauchy", "arctan", "tukey", or a
            ``RobustLoss`` (whose own scale is used). f_scale: C > 0, the scale of a named
            loss (scipy's ``f_scale``).

    Returns:
        A ``Solution``; for the batched solvers ``stats`` is a ``LeastSquaresStats`` whose
        ``status`` says what ended each sample.

    Raises:
        ValueError: per-sample residuals that are not (B, ...) or that couple samples; a
            non-positive ``f_scale``.
    """
    if not callable(residuals):
        raise TypeError(f"{WHERE}: residuals must be callable, got {type(residuals).__name__}")
    robust = loss if isinstance(loss, RobustLoss) else RobustLoss(loss, f_scale)
    resolved = MINIMIZERS.resolve(GaussNewton() if solver is None else solver, Minimizer)
    if not isinstance(resolved, SumOfSquaresSolver):
        cost = _summed_cost(residuals, robust)
        return minimize(cost, z0, *args, solver=resolved, adjoint=adjoint)
    spec = StateSpec.of(z0)
    if adjoint is None:
        coupled = Auto(iterative_solver=CG(), block_max=0)  # one problem: no per-sample blocks
        adjoint = Implicit(
            linear_solver=coupled if batch_coupled else PerSampleDense(spec.batch),
            fixed_point_tol=max(1e-3, 30 * torch.finfo(spec.dtype).eps ** 0.5),
        )
    adjoint = ADJOINTS.resolve(adjoint, Adjoint)
    spec, z0_t, args = guarded_inputs(z0, args, f"{WHERE} (adjoint={adjoint.name})")
    rows_of = _rows(residuals, spec, batch_coupled)
    count = 1 if batch_coupled else spec.batch

    def flat_residuals(x: Tensor) -> Tensor:
        return rows_of(spec.unflatten(x.reshape(spec.batch, -1)), args)

    x0 = spec.flatten(z0_t).reshape(count, -1)
    with torch.no_grad():
        rows = flat_residuals(x0.detach()).shape[1]
    problem = SumOfSquares(
        flat_residuals, rows, robust, spec.batch, not batch_coupled and spec.batch > 1, WHERE
    )

    scale: list[Tensor] = []

    def run(grad_steps: int) -> tuple[State, Any]:
        x, stats = resolved.solve_sum_of_squares(problem, x0, grad_steps)
        assert stats.gradient_scale is not None
        scale.append(stats.gradient_scale.clamp_min(torch.finfo(spec.dtype).tiny))
        return spec.unflatten(x.reshape(spec.batch, -1)), stats

    def gradient(z: State, inputs: tuple[Any, ...]) -> State:
        """The gradient of the cost divided by its scale at z* per problem (a constant), so
        the fixed-point check is scale free; the root and the implicit gradient are those of
        the gradient itself."""
        create = torch.is_grad_enabled()
        with torch.enable_grad():
            zr = tuple(t if t.requires_grad else t.detach().requires_grad_() for t in z)
            cost = robust.cost(rows_of(zr, inputs)).sum()
            grads = torch.autograd.grad(cost, zr, create_graph=create, allow_unused=True)
        out = spec.zeros_like_missing(grads, zr)
        divisor = scale[-1][:1] if batch_coupled else scale[-1]
        out = tuple(t / divisor.reshape(-1, *[1] * (t.ndim - 1)) for t in out)
        return out if create else tuple(t.detach() for t in out)

    condition = Condition(BoundStep(gradient, args), root_of=SCALED, label="Hessian")
    z, stats, log = differentiate(run, resolved, adjoint, condition, spec)
    return Solution(spec.restore(z), stats, log)


def _rows(
    residuals: Callable[..., Tensor], spec: StateSpec, coupled: bool
) -> Callable[[State, tuple[Any, ...]], Tensor]:
    """``(z, inputs) -> (P, R)``: the residuals per problem (P = B, or 1 when coupled),
    checked to be a Tensor of the state's dtype, batch first when per sample."""
    batch = spec.batch

    def rows(z: State, inputs: tuple[Any, ...]) -> Tensor:
        r = residuals(spec.restore(z), *inputs)
        if not isinstance(r, Tensor):
            raise TypeError(f"{WHERE}: residuals must return a Tensor, got {type(r).__name__}")
        if r.dtype != spec.dtype:
            raise TypeError(
                f"{WHERE}: the residuals have dtype {r.dtype}, z0 has {spec.dtype}; give z0 and "
                "the arguments one dtype"
            )
        if coupled or batch == 1:
            return r.reshape(1, -1)
        if r.ndim == 0 or r.shape[0] != batch:
            raise ValueError(
                f"{WHERE}: per-sample residuals must be batch first, (B={batch}, ...), got "
                f"shape {tuple(r.shape)}; return each sample's residuals in row b, or pass "
                "batch_coupled=True for residuals of the whole batch"
            )
        return r.reshape(batch, -1)

    return rows


def _summed_cost(residuals: Callable[..., Tensor], robust: RobustLoss) -> Callable[..., Tensor]:
    """The scalar cost ``½ C² Σ ρ(r² / C²)`` for ``minimize``."""

    def cost(z: Any, *inputs: Any) -> Tensor:
        return robust.cost(residuals(z, *inputs).reshape(1, -1)).sum()

    return cost
