"""Differentiating an optimality condition ``g(z*, θ) = 0``, shared by ``root`` and ``minimize``.

``differentiate`` attaches the gradient a backward mode defines to a solution of a root or argmin
problem (``Condition`` names the residual map ``g`` and its explicit inputs): ``Implicit`` /
``Neumann`` by the implicit-function theorem, ``dz*/dθ = -(dg/dz)^{-1} dg/dθ``, through
``implicit_backward.attach_root_gradient`` (the same Function as the fixed-point layers');
the through-iteration modes by the solver's own differentiable steps. ``guarded_inputs``
applies the gradient guard to the explicit inputs first.
"""


from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from implicit_ham._core.grad_guard import guard_gradient
from implicit_ham._core.state import State, StateSpec, StepFn
from implicit_ham._core.stats import BackwardStats, SolverStats
from implicit_ham._core.transforms import active_transforms
from implicit_ham.adjoints.adjoint_system import (
    AdjointSystem,
    Attachment,
    FixedPointSystem,
    RootSystem,
)
from implicit_ham.adjoints.fixed_point_check import FixedPointCheck
from implicit_ham.adjoints.implicit_backward import attach_gradient
from implicit_ham.adjoints.modes import (
    Adjoint,
    AtFixedPoint,
    ThroughIterations,
)
from implicit_ham.solvers.base import FixedPointSolver
from implicit_ham.solvers.newton import RootSolver


def guarded_inputs(
    z0: Tensor | Sequence[Tensor], args: tuple[Any, ...], where: str
) -> tuple[StateSpec, State, tuple[Any, ...]]:
    """The state's spec, z0 as a tuple and args, each input guarded against a non-finite
    gradient (as in ``fixed_point``)."""
    spec = StateSpec.of(z0)
    if spec.batch == 0:
        raise ValueError(f"{where}: z0 has an empty batch (B = 0); there is nothing to solve")
    args = tuple(guard_gradient(a, f"{where}, args[{i}]") for i, a in enumerate(args))
    z0_t = tuple(guard_gradient(t, f"{where}, z0[{i}]") for i, t in enumerate(spec.as_tuple(z0)))
    return spec, z0_t, args


def refuse_without_replay(name: str, grad_steps: int) -> None:
    """ValueError for a through-iteration backward mode (``grad_steps > 0``) on a root / argmin
    solver that does not declare the capability of replaying its own steps
    (``ReplaysIterates`` / ``ReplaysSteps``): its steps are not differentiable maps."""
    if grad_steps > 0:
        raise ValueError(
            f"{name}: its steps (inner linear solves, line searches) are not differentiable "
            "steps, so it cannot carry a through-iteration gradient (Unroll, Truncated, "
            "OneStep). Use adjoint=Implicit(...) or Neumann(...), or a solver whose steps "
            "are plain maps (a fixed-point solver for root, GradientDescent for minimize)."
        )


@dataclass(frozen=True)
class Condition:
    """The optimality condition an at-point backward mode differentiates.

    Attributes:
        fn: g (a root, ``root_of`` set) or f (a fixed point ``z = f(z)``, ``root_of=None``),
            tuples in and out.
        root_of: the name of g in messages, or None for a fixed point.
        label: the system's name in messages ("dg/dz", "Hessian", "I - J").
    """

    fn: StepFn
    root_of: str | None
    label: str

    def system(self) -> AdjointSystem:
        """The adjoint system the backward pass solves (``adjoint_system``)."""
        return FixedPointSystem() if self.root_of is None else RootSystem(self.label)


def differentiate(
    run: Callable[[int], tuple[State, SolverStats]],
    solver: RootSolver | FixedPointSolver | Any,
    adjoint: Adjoint,
    condition: Condition,
    spec: StateSpec,
) -> tuple[State, SolverStats, list[BackwardStats]]:
    """Run the solve (``run(grad_steps)``) under ``adjoint``: through-iteration modes get
    their trailing steps with gradient (how many: ``adjoint.grad_steps(solver)``, which reads
    the solver's ``max_steps``); at-point modes solve without gradient and attach the implicit
    gradient of ``condition`` at the solution."""
    if isinstance(adjoint, ThroughIterations):
        z, stats = run(adjoint.grad_steps(solver))  # type: ignore[arg-type]  # reads max_steps
        return z, stats, []
    adjoint = _at_point(adjoint, condition)
    with torch.no_grad():
        z, stats = run(0)
    log: list[BackwardStats] = []
    check = FixedPointCheck(
        adjoint.name, adjoint.fixed_point_tol, adjoint.on_divergence, condition.root_of
    )
    setup = Attachment(spec, adjoint.backward_solve, log, check, adjoint.second_order())
    return attach_gradient(condition.fn, z, condition.system(), setup), stats, log


def _at_point(adjoint: Adjoint, condition: Condition) -> AtFixedPoint:
    """``adjoint`` as an at-point mode, after the clear early errors: a mode that is neither
    at the point nor through the iterations, a root / argmin solve under vmap, a ridge on a
    root."""
    if not isinstance(adjoint, AtFixedPoint):
        raise ValueError(
            f"{adjoint.name} is not available for root / argmin layers; use Implicit, Neumann "
            "(at the solution) or Unroll, Truncated, OneStep (through the iterations)"
        )
    if "Vmap" in active_transforms():
        raise NotImplementedError(
            f"{adjoint.name} in a root / argmin layer under torch.func.vmap "
            f"({' > '.join(active_transforms())}): the forward solvers' line searches and "
            "stopping tests read values on the host, which a batched value cannot decide. Put "
            "the problems in the batch dimension instead (B independent problems, the default "
            "of minimize), or vmap only the backward pass (torch.func.jacrev with "
            "Implicit(linear_solver='dense'))."
        )
    ridge: float = getattr(adjoint, "ridge", 0.0)
    if condition.root_of is not None and ridge:
        raise ValueError(
            "Implicit(ridge > 0) discounts a fixed-point map's Jacobian and has no meaning for "
            "a root / minimum; use ridge=0 (regularise the problem itself instead)"
        )
    return adjoint
