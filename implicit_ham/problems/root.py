"""``root``: the layer ``z* : g(z*, *args) = 0``, differentiated through its optimality condition.

Forward: a root solver (``Newton`` with any linear solver of the library) or any fixed-point
solver (``FixedPointIteration``, ``Anderson``, ``Broyden``) applied to ``z <- z - g(z)``.
Backward: the library's backward modes. ``Implicit`` / ``Neumann`` differentiate ``g(z*, θ) = 0``
by the implicit-function theorem, ``dz*/dθ = -(dg/dz)^{-1} dg/dθ``: the backward pass solves
``(dg/dz)^T w = v`` with the chosen linear solver and hands ``-w`` to g's graph
(``implicit_backward.attach_root_gradient``, the same Function as the fixed-point layers').
``Unroll`` / ``Truncated`` / ``OneStep`` differentiate the solver's iterations (fixed-point
solvers only; Newton's linear solves are not differentiable steps). ``Phantom`` is refused.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from torch import Tensor

from implicit_ham._core.state import BoundStep, State
from implicit_ham._core.stats import SolverStats
from implicit_ham._core.transforms import active_transforms
from implicit_ham.adjoints.conditions import (
    Condition,
    differentiate,
    guarded_inputs,
    refuse_without_replay,
)
from implicit_ham.adjoints.modes import (
    ADJOINTS,
    Adjoint,
    Implicit,
    solve_through_iterations,
)
from implicit_ham.problems.fixed_point import Solution
from implicit_ham.problems.pytree_state import Tree, TreeState
from implicit_ham.solvers.base import SOLVERS, FixedPointSolver, ReplaysIterates
from implicit_ham.solvers.newton import ROOT_SOLVERS, Newton, RootSolver


def root(
    g: Callable[..., Tensor | Sequence[Tensor] | Tree],
    z0: Tensor | Sequence[Tensor] | Tree,
    *args: Any,
    solver: RootSolver | FixedPointSolver | str | None = None,
    adjoint: Adjoint | str | None = None,
) -> Solution:
    """Solve ``g(z, *args) = 0`` from ``z0``; differentiate the root with the chosen mode.

    Args:
        g: ``g(z, *args) -> r`` with r shaped like z (a Tensor, a tuple or a dict / pytree of
            Tensors, batch first). Tensors the gradient must reach go in ``args`` or are
            closed over.
        z0: initial state, (B, ...), a tuple of (B, ...) tensors or a dict / pytree of them
            (e.g. ``ih.module_state(model)``), sharing B and dtype. The whole state is one
            system (samples may be coupled); residuals are per sample.
        *args: extra inputs of ``g``.
        solver: a ``RootSolver`` (default ``Newton()``), a fixed-point ``FixedPointSolver``
            (applied to ``z <- z - g(z)``; damp it for a g whose Jacobian is not close to I), or
            a name from ``ROOT_SOLVERS`` then ``SOLVERS``.
        adjoint: default ``Implicit()`` (GMRES on ``(dg/dz)^T w = v``). Its
            ``fixed_point_tol`` bounds ``||g(z*)||`` here (absolute, worst sample).
            ``Unroll`` / ``Truncated`` / ``OneStep`` need a fixed-point solver.

    Returns:
        A ``Solution``; the value does not depend on the backward mode.

    Raises:
        ValueError: Phantom, ``Implicit(ridge > 0)``, or a through-iteration mode with Newton.
        NotImplementedError: Newton under a torch.func transform (its Jacobian-vector
            products use torch.autograd, which torch.func cannot trace: use a fixed-point
            solver such as ``Anderson`` there), or any solve under ``torch.func.vmap``.
    """
    if not callable(g):
        raise TypeError(f"g must be callable, got {type(g).__name__}")
    tree = TreeState.of(z0, "root")
    g, z0 = tree.on_leaves(g, returns_tree=True), tree.leaves(z0)
    solver = resolve_root_solver(solver)
    if active_transforms() and not isinstance(solver, FixedPointSolver):
        raise NotImplementedError(
            f"root: {solver.name} under torch.func ({' > '.join(active_transforms())}) "
            "differentiates g with torch.autograd inside, which torch.func cannot trace; use "
            "a fixed-point solver there (solver=ih.Anderson(...)), or torch.autograd outside"
        )
    adjoint = ADJOINTS.resolve(Implicit() if adjoint is None else adjoint, Adjoint)
    spec, z0_t, args = guarded_inputs(z0, args, f"root (adjoint={adjoint.name})")

    def residual_at(z: State, inputs: tuple[Any, ...]) -> State:
        return spec.check(g(spec.restore(z), *inputs), where="root")

    residual = BoundStep(residual_at, args)

    def run(grad_steps: int) -> tuple[State, SolverStats]:
        if isinstance(solver, FixedPointSolver):
            return solve_through_iterations(
                solver, lambda z: _minus(z, residual(z)), z0_t, spec, grad_steps
            )
        if isinstance(solver, ReplaysIterates):
            return solver.solve_replaying(residual, z0_t, spec, grad_steps)
        refuse_without_replay(solver.name, grad_steps)
        return solver.solve(residual, z0_t, spec)

    z, stats, log = differentiate(
        run, solver, adjoint, Condition(residual, root_of="g", label="dg/dz"), spec
    )
    return Solution(tree.rebuild(spec.restore(z)), stats, log)


def resolve_root_solver(
    solver: RootSolver | FixedPointSolver | str | None,
) -> RootSolver | FixedPointSolver:
    """A root solver, a fixed-point solver, or a name from ``ROOT_SOLVERS`` then ``SOLVERS``."""
    if solver is None:
        return Newton()
    if isinstance(solver, str):
        if solver in ROOT_SOLVERS.names():
            return ROOT_SOLVERS.make(solver)
        if solver in SOLVERS.names():
            return SOLVERS.make(solver)
        raise KeyError(
            f"unknown root solver {solver!r}; valid choices: "
            f"{', '.join(ROOT_SOLVERS.names() + SOLVERS.names())}"
        )
    if not isinstance(solver, (RootSolver, FixedPointSolver)):
        raise TypeError(
            "expected a root solver (a RootSolver or FixedPointSolver instance, or one of "
            f"{', '.join(ROOT_SOLVERS.names() + SOLVERS.names())}), got {type(solver).__name__}"
        )
    return solver


def _minus(z: State, r: State) -> State:
    return tuple(a - b for a, b in zip(z, r, strict=True))
