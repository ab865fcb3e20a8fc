"""``minimize``: the argmin layer, differentiated through its optimality condition
(``least_squares`` lives in ``implicit_ham.problems.least_squares`` and shares ``_solve``).

The at-point backward modes (``Implicit``, ``Neumann``) differentiate ``grad_z loss(z*, θ) = 0``:
the backward pass solves ``H w = v`` (H the Hessian at z*, applied by double backward, never
formed except by ``Dense``) and hands ``-w`` to the gradient's graph, i.e.
``dL/dθ = -(d grad_z loss / dθ)^T H^{-1} v`` (the root layer with ``g = grad_z loss``). The
default linear solver is CG, which refuses an indefinite Hessian with
``NotPositiveDefiniteError``; use GMRES for an indefinite or non-symmetric system, Dense for
small problems. Under a constraint (projected gradient descent) they differentiate the fixed
point ``z* = P(z* - lr grad_z loss(z*))`` instead, with the fixed-point machinery.
``Unroll`` / ``Truncated`` / ``OneStep`` differentiate the iterations of ``GradientDescent``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, cast

import torch
from torch import Tensor
from torch.utils import _pytree

from implicit_ham._core.errors import name_the_call
from implicit_ham._core.state import BoundStep, State, StateSpec
from implicit_ham._core.stats import SolverStats
from implicit_ham._core.transforms import active_transforms
from implicit_ham.adjoints.conditions import (
    Condition,
    differentiate,
    guarded_inputs,
    refuse_without_replay,
)
from implicit_ham.adjoints.modes import ADJOINTS, Adjoint, Implicit
from implicit_ham.adjoints.per_sample import PerSampleCG
from implicit_ham.linalg.auto import BLOCK_MAX, Auto
from implicit_ham.linalg.krylov import CG
from implicit_ham.problems.fixed_point import Solution
from implicit_ham.problems.pytree_state import Tree, TreeState
from implicit_ham.solvers.coupling import check_independent_loss
from implicit_ham.solvers.least_squares import GaussNewton
from implicit_ham.solvers.minimizers import (
    MINIMIZERS,
    GradientDescent,
    Minimizer,
    Objective,
    ReplaysSteps,
)
from implicit_ham.solvers.projections import CONSTRAINTS, Constraint
from implicit_ham.solvers.quasi_newton import LBFGS

LossFn = Callable[..., Tensor]


def minimize(
    loss: LossFn,
    z0: Tensor | Sequence[Tensor] | Tree,
    *args: Any,
    solver: Minimizer | str | None = None,
    adjoint: Adjoint | str | None = None,
    constraint: Constraint | str | None = None,
    batch_coupled: bool = False,
) -> Solution:
    """``z* = argmin_z loss(z, *args)`` from ``z0``, differentiated by the chosen mode.

    Args:
        loss: ``loss(z, *args)`` -> the (B,) per-sample losses of B independent problems, or
            a scalar (their sum, or one coupled problem's loss). z has z0's structure (a
            Tensor, a tuple or a dict / pytree of Tensors, batch first). Tensors the gradient
            must reach go in ``args`` or are closed over.
        z0: initial point: (B, ...), a tuple of (B, ...) tensors, or a dict / pytree of them
            (e.g. ``ih.module_state(model)``: a network's weights), all leaves sharing B
            and dtype (a leaf with another batch size is a ValueError). Stats are per sample.
        *args: extra inputs of ``loss``.
        batch_coupled: False (default): the B samples are independent problems; ``LBFGS`` /
            ``NewtonCG`` give each its own line search, curvature memory and stopping test
            (with a scalar loss the rows share one step size: return the (B,) losses for
            fully independent searches); ``GradientDescent`` stops each sample once its
            gradient is within tol (frozen afterwards; it does so for True too); the default
            backward solves each sample's Hessian block (``PerSampleCG``). The loss must not
            couple the samples then (their gradients would mix): a probe of the Hessian at z0
            raises ValueError when sample 0 and the others are coupled (e.g. a single (n,)
            vector passed without its batch dimension; ``solvers.coupling``); True: the whole
            state is one problem (one search, CG on the whole Hessian).
        solver: a ``Minimizer`` or a name from ``MINIMIZERS``; default ``LBFGS()``
            (``GradientDescent()`` under a constraint).
        adjoint: default ``Implicit(linear_solver=Auto(iterative_solver=CG()))``:
            differentiate ``grad_z loss = 0``, densely for a small Hessian (``linalg.Auto``:
            at most 128 unknowns, or 32 per sample; exact, with κ), else by scaled CG
            (Hessian-vector products; CG needs a positive-definite Hessian); for B > 1
            independent problems (``batch_coupled=False``) ``PerSampleCG(B)``: CG on each
            sample's Hessian block, each stopping on its own residual. Its
            ``fixed_point_tol`` bounds ``||grad_z loss(z*)||`` (absolute, worst sample). Under
            a constraint the default is ``Implicit()`` (GMRES: the projected map's ``I - J``
            is not symmetric) and ``fixed_point_tol`` bounds the map's relative residual.
        constraint: ``NonNegative()``, ``Box(lower, upper)`` or a name; None: unconstrained.
            Needs ``GradientDescent`` (projected gradient).

    Returns:
        A ``Solution``; the value does not depend on the backward mode.
    """
    tree = TreeState.of(z0, "minimize")
    solution = _solve(
        tree.on_leaves(loss), None, tree.leaves(z0), args, solver, adjoint, constraint,
        "minimize", batch_coupled,
    )
    return dataclasses.replace(solution, value=tree.rebuild(solution.value))


def _solve(
    loss: LossFn,
    residuals: Callable[..., Tensor] | None,
    z0: Tensor | Sequence[Tensor],
    args: tuple[Any, ...],
    solver: Minimizer | str | None,
    adjoint: Adjoint | str | None,
    constraint: Constraint | str | None,
    where: str,
    batch_coupled: bool = True,
) -> Solution:
    if not callable(loss):
        raise TypeError(f"{where}: the loss must be callable, got {type(loss).__name__}")
    constraint = None if constraint is None else CONSTRAINTS.resolve(constraint, Constraint)
    solver = _resolve_solver(solver, residuals is not None, constraint, where)
    default = adjoint is None
    adjoint = ADJOINTS.resolve(Implicit() if adjoint is None else adjoint, Adjoint)
    spec, z0_t, args = guarded_inputs(z0, args, f"{where} (adjoint={adjoint.name})")
    if default and constraint is None:  # CG for the symmetric Hessian, per sample if independent
        per_sample = not batch_coupled and spec.batch > 1
        iterative = PerSampleCG(spec.batch) if per_sample else CG()
        blocks = BLOCK_MAX if per_sample else 0  # coupled: one problem, no per-sample blocks
        adjoint = Implicit(linear_solver=Auto(block_max=blocks, iterative_solver=iterative))
    # under a constraint the default is GMRES: the projected map's I - J is not symmetric

    def objective_at(inputs: tuple[Any, ...]) -> Objective:
        return Objective(
            _scalar_loss(loss, spec, inputs, where),
            spec,
            None if residuals is None else _state_fn(residuals, spec, inputs),
            constraint,
            batch_coupled,
        )

    objective = objective_at(args)
    if residuals is None and not batch_coupled:  # least_squares probes its residuals itself
        check_independent_loss(objective_at(_detached(args)), z0_t, where)

    def run(grad_steps: int) -> tuple[State, SolverStats]:
        # a solve without gradient (the at-point modes') evaluates the loss on detached
        # inputs: its autograd graphs then hold only the state's branch
        plain = not torch.is_grad_enabled() and not active_transforms()
        at = objective_at(_detached(args)) if plain else objective
        if isinstance(solver, ReplaysSteps):
            return solver.minimize_replaying(at, z0_t, grad_steps)
        refuse_without_replay(solver.name, grad_steps)
        return solver.minimize(at, z0_t)

    z, stats, log = differentiate(
        run,
        solver,
        adjoint,
        _condition(objective_at, args, solver),
        spec,
    )
    return Solution(spec.restore(z), stats, log)


def _condition(
    objective_at: Callable[[tuple[Any, ...]], Objective],
    args: tuple[Any, ...],
    solver: Minimizer,
) -> Condition:
    """``grad_z loss = 0``, or the projected-gradient fixed point under a constraint; a
    ``BoundStep`` over ``args`` (second derivatives re-evaluate it at other inputs)."""
    if objective_at(args).constraint is not None and isinstance(solver, GradientDescent):
        step = solver

        def projected(z: State, inputs: tuple[Any, ...]) -> State:
            return step.step_map(objective_at(inputs))(z)

        return Condition(BoundStep(projected, args), root_of=None, label="I - J")

    def gradient(z: State, inputs: tuple[Any, ...]) -> State:
        return objective_at(inputs).gradient(z)

    return Condition(BoundStep(gradient, args), root_of="grad_z loss", label="Hessian")


def _resolve_solver(
    solver: Minimizer | str | None,
    has_residuals: bool,
    constraint: Constraint | None,
    where: str,
) -> Minimizer:
    if solver is None:
        default: Minimizer = GaussNewton() if has_residuals else LBFGS()
        solver = GradientDescent() if constraint is not None else default
    solver = MINIMIZERS.resolve(solver, Minimizer)
    if solver.needs_residuals and not has_residuals:
        raise ValueError(
            f"{where}: {solver.name} needs the residuals of a sum of squares; call "
            "ih.least_squares(residuals, z0, ...) instead of ih.minimize"
        )
    if constraint is not None and not solver.supports_constraints:
        raise ValueError(
            f"{where}: constraint={constraint.name} needs a projected solver; "
            f"{solver.name} is unconstrained. Use solver=GradientDescent(lr=...)."
        )
    return solver


def _scalar_loss(
    loss: LossFn, spec: StateSpec, args: tuple[Any, ...], where: str
) -> Callable[[State], Tensor]:
    """``loss`` on the internal tuple state, checked to return a scalar or (B,) per-sample
    losses of the state's dtype."""

    def on_state(z: State) -> Tensor:
        try:
            value = loss(spec.restore(z), *args)
        except Exception as error:
            name_the_call(error, where, "loss", z, args)
            raise
        if not isinstance(value, Tensor) or (
            value.numel() != 1 and tuple(value.shape) != (spec.batch,)
        ):
            shape = tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__
            raise ValueError(
                f"{where}: the loss must return a scalar Tensor or the ({spec.batch},) losses "
                f"of the batch's problems, got {shape}"
            )
        if value.dtype != spec.dtype:
            raise TypeError(
                f"{where}: the loss has dtype {value.dtype}, z0 has {spec.dtype}; give z0 and "
                "the arguments one dtype"
            )
        return value.reshape(()) if value.numel() == 1 and value.ndim else value

    return on_state


def _detached(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """``args`` with every Tensor (inside tuples, lists and dicts too) detached."""
    return cast(
        tuple[Any, ...],
        _pytree.tree_map(lambda a: a.detach() if isinstance(a, Tensor) else a, args),
    )


def _state_fn(
    fn: Callable[..., Tensor], spec: StateSpec, args: tuple[Any, ...]
) -> Callable[[State], Tensor]:
    return lambda z: fn(spec.restore(z), *args)
