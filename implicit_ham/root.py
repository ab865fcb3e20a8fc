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

import logging
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from implicit_ham.adjoints import ADJOINTS, Adjoint, AtFixedPoint, Implicit, ThroughIterations
from implicit_ham.errors import ConvergenceWarning, NonFiniteError
from implicit_ham.fixed_point import Solution
from implicit_ham.grad_guard import guard_gradient
from implicit_ham.implicit_backward import FixedPointCheck, attach_fixed_point_gradient, attach_root_gradient
from implicit_ham.linear_solvers import LINEAR_SOLVERS, AdjointOperator, LinearSolver
from implicit_ham.registry import Registry
from implicit_ham.solvers import SOLVERS, Solver
from implicit_ham.state import BoundStep, State, StateSpec, StepFn, per_sample_norm
from implicit_ham.stats import BackwardStats, SolverStats
from implicit_ham.transforms import active_transforms, host_checks
from implicit_ham.validation import check_positive_int, check_tolerance, check_unit_interval

logger = logging.getLogger(__name__)

ROOT_SOLVERS: Registry[RootSolver] = Registry("root solver")


class RootSolver(ABC):
    """A solver of ``g(z) = 0`` (a small frozen dataclass in every concrete case).

    ``solve`` returns the root and a ``SolverStats`` whose residuals are ``||g(z_k)||`` per
    sample after each step, ``rel_residual = ||g(z)|| / ||g(z0)||`` and ``converged`` the
    absolute residual ``<= tol``.
    """

    max_steps: int
    tol: float | None

    @abstractmethod
    def solve(
        self, g: StepFn, z0: State, spec: StateSpec, grad_steps: int = 0
    ) -> tuple[State, SolverStats]:
        """Solve ``g(z) = 0`` from ``z0``; ``grad_steps > 0`` is refused by solvers whose steps
        are not differentiable (ValueError naming the modes that work)."""

    @property
    def name(self) -> str:
        """The registry name of this solver."""
        return ROOT_SOLVERS.name_of(self) or type(self).__name__


@ROOT_SOLVERS.register("newton")
@dataclass(frozen=True)
class Newton(RootSolver):
    """Newton's method: ``z <- z + damping * Δ`` with ``(dg/dz) Δ = -g(z)`` solved by a linear
    solver of the library on Jacobian-vector products (``torch.func.jvp``).

    Args:
        linear_solver: "gmres" (default), "dense" (small problems), "cg" (symmetric
            positive-definite dg/dz only), ... or a ``LinearSolver``.
        max_steps: Newton iterations. tol: stop when every sample's ``||g(z)|| <= tol``.
        linear_max_steps, linear_tol: the inner solve's budget and relative tolerance.
        damping: step size in (0, 1].
    """

    linear_solver: LinearSolver | str = "gmres"
    max_steps: int = 20
    tol: float | None = 1e-8
    linear_max_steps: int = 200
    linear_tol: float = 1e-10
    damping: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "linear_solver", LINEAR_SOLVERS.resolve(self.linear_solver, LinearSolver)
        )
        check_positive_int("Newton", "max_steps", self.max_steps)
        check_tolerance("Newton", "tol", self.tol, optional=True)
        check_positive_int("Newton", "linear_max_steps", self.linear_max_steps)
        check_tolerance("Newton", "linear_tol", self.linear_tol)
        check_unit_interval("Newton", "damping", self.damping)

    def solve(
        self, g: StepFn, z0: State, spec: StateSpec, grad_steps: int = 0
    ) -> tuple[State, SolverStats]:
        refuse_grad_steps(self.name, grad_steps)
        solver: LinearSolver = self.linear_solver  # type: ignore[assignment]
        trace = ResidualTrace(self.name)
        x = spec.flatten(z0).reshape(-1)

        def flat_g(y: Tensor) -> Tensor:
            return spec.flatten(g(spec.unflatten(y.reshape(spec.batch, -1)))).reshape(-1)

        with torch.no_grad():
            gx = flat_g(x)
            trace.start(spec, gx)
            for _ in range(self.max_steps):
                if trace.done(self.tol):
                    break
                op = jacobian_operator(flat_g, x, "dg/dz")
                delta, _, _ = solver.solve(op, -gx, self.linear_max_steps, self.linear_tol)
                x = x + self.damping * delta
                gx = flat_g(x)
                trace.record(spec, gx)
        return spec.unflatten(x.reshape(spec.batch, -1)), trace.build(self.tol)


def jacobian_operator(fn: Callable[[Tensor], Tensor], x: Tensor, label: str) -> AdjointOperator:
    """The linear operator ``A = d fn / dx`` at x (M,), posed for the linear solvers as the
    system ``A Δ = b`` (``system``; ``vjp = I - A`` its Richardson form).

    ``fn`` is evaluated once; each product ``A v`` is the derivative of the VJP
    ``u -> A^T u`` in the direction v (double backward on the retained graph), cheaper than
    re-tracing ``fn`` with ``torch.func.jvp`` per product.
    """
    with torch.enable_grad():
        x_req = x.detach().requires_grad_()
        out = fn(x_req)
        u = torch.zeros_like(out, requires_grad=True)
        (transposed,) = torch.autograd.grad(out, x_req, u, create_graph=True, allow_unused=True)
    if transposed is None or not transposed.requires_grad:  # fn is affine or constant in x
        dense = torch.func.jacrev(fn)(x.detach()) if transposed is not None else None

        def jvp(v: Tensor) -> Tensor:
            return torch.zeros_like(v) if dense is None else dense @ v.to(dense.dtype)

    else:

        def jvp(v: Tensor) -> Tensor:
            (product,) = torch.autograd.grad(
                transposed, u, v.to(x.dtype), retain_graph=True, allow_unused=True
            )
            return (torch.zeros_like(v) if product is None else product.detach()).to(v.dtype)

    def jvp_rows(rows: Tensor) -> Tensor:
        return torch.stack([jvp(r) for r in rows])

    return AdjointOperator(
        vjp=lambda v: v - jvp(v),
        vjp_batched=lambda rows: rows - jvp_rows(rows),
        size=x.numel(),
        system=jvp,
        system_batched=jvp_rows,
        label=label,
    )


@dataclass
class ResidualTrace:
    """Per-sample ``||g(z_k)||`` of a root / argmin solve (the rows of ``SolverStats``)."""

    solver: str
    rows: list[Tensor] | None = None
    first: Tensor | None = None

    def start(self, spec: StateSpec, flat_residual: Tensor) -> None:
        """The residual at z0 (not a step; the reference of ``rel_residual``)."""
        self.rows, self.first = [], self._norms(spec, flat_residual)
        self._check(self.first, 0)

    def record(self, spec: StateSpec, flat_residual: Tensor) -> None:
        """The residual after one more step."""
        assert self.rows is not None
        self.rows.append(self._norms(spec, flat_residual))
        self._check(self.rows[-1], len(self.rows))

    def done(self, tol: float | None) -> bool:
        """Whether every sample's latest residual is ``<= tol``."""
        last = self.rows[-1] if self.rows else self.first
        return tol is not None and last is not None and bool((last <= tol).all())

    def build(self, tol: float | None) -> SolverStats:
        """The ``SolverStats``; warns ``ConvergenceWarning`` when ``tol`` was missed."""
        assert self.rows is not None and self.first is not None
        last = self.rows[-1] if self.rows else self.first
        trace = torch.stack(self.rows) if self.rows else self.first.new_zeros(0, len(last))
        rel = last / (self.first + torch.finfo(last.dtype).tiny)
        converged = None if tol is None else last <= tol
        stats = SolverStats(self.solver, len(self.rows), trace, last, rel, converged)
        if converged is not None and host_checks() and not bool(converged.all()):
            warnings.warn(
                f"{self.solver}: did not reach tol={tol:g} in {stats.steps} steps (worst "
                f"residual {float(last.max()):.3e}); raise max_steps or change the solver",
                ConvergenceWarning,
                stacklevel=4,
            )
        return stats

    @staticmethod
    def _norms(spec: StateSpec, flat_residual: Tensor) -> Tensor:
        return per_sample_norm((flat_residual.detach().reshape(spec.batch, -1),))

    def _check(self, norms: Tensor, step: int) -> None:
        if host_checks() and not bool(torch.isfinite(norms).all()):
            where = "the initial state z0" if step == 0 else f"step {step}"
            raise NonFiniteError(
                f"{self.solver}: non-finite residual (NaN or inf) at {where}. Check the "
                "problem for overflow, damp the steps, or use float64."
            )


def refuse_grad_steps(solver: str, grad_steps: int) -> None:
    """ValueError for a through-iteration backward mode on a solver without differentiable
    steps (the same refusal as torchdeq's solvers under Unroll)."""
    if grad_steps > 0:
        raise ValueError(
            f"{solver}: its steps (inner linear solves, line searches) are not differentiable "
            "steps, so it cannot carry a through-iteration gradient (Unroll, Truncated, "
            "OneStep). Use adjoint=Implicit(...) or Neumann(...), or a solver whose steps "
            "are plain maps (a fixed-point solver for root, GradientDescent for minimize)."
        )


def root(
    g: Callable[..., Tensor | Sequence[Tensor]],
    z0: Tensor | Sequence[Tensor],
    *args: Any,
    solver: RootSolver | Solver | str | None = None,
    adjoint: Adjoint | str | None = None,
) -> Solution:
    """Solve ``g(z, *args) = 0`` from ``z0``; differentiate the root with the chosen mode.

    Args:
        g: ``g(z, *args) -> r`` with r shaped like z (a Tensor or tuple of Tensors, batch
            first). Tensors the gradient must reach go in ``args`` or are closed over.
        z0: initial state, (B, ...) or a tuple of (B, ...) tensors sharing B and dtype. The
            whole state is one system (samples may be coupled); residuals are per sample.
        *args: extra inputs of ``g``.
        solver: a ``RootSolver`` (default ``Newton()``), a fixed-point ``Solver`` (applied to
            ``z <- z - g(z)``; damp it for a g whose Jacobian is not close to I), or a name
            from ``ROOT_SOLVERS`` then ``SOLVERS``.
        adjoint: default ``Implicit()`` (GMRES on ``(dg/dz)^T w = v``). Its
            ``fixed_point_tol`` bounds ``||g(z*)||`` here (absolute, worst sample).
            ``Unroll`` / ``Truncated`` / ``OneStep`` need a fixed-point solver.

    Returns:
        A ``Solution``; the value does not depend on the backward mode.

    Raises:
        ValueError: Phantom, ``Implicit(ridge > 0)``, or a through-iteration mode with Newton.
    """
    if not callable(g):
        raise TypeError(f"g must be callable, got {type(g).__name__}")
    solver = resolve_root_solver(solver)
    adjoint = ADJOINTS.resolve(Implicit() if adjoint is None else adjoint, Adjoint)
    spec, z0_t, args = guarded_inputs(z0, args, f"root (adjoint={adjoint.name})")

    def residual_at(z: State, inputs: tuple[Any, ...]) -> State:
        return spec.check(g(spec.restore(z), *inputs), where="root")

    residual = BoundStep(residual_at, args)

    def run(grad_steps: int) -> tuple[State, SolverStats]:
        if isinstance(solver, Solver):
            return solver.solve(lambda z: _minus(z, residual(z)), z0_t, spec, grad_steps)
        return solver.solve(residual, z0_t, spec, grad_steps)

    z, stats, log = differentiate(
        run, solver, adjoint, Condition(residual, root_of="g", label="dg/dz"), spec
    )
    return Solution(spec.restore(z), stats, log)


def resolve_root_solver(solver: RootSolver | Solver | str | None) -> RootSolver | Solver:
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
    if not isinstance(solver, (RootSolver, Solver)):
        raise TypeError(
            f"expected a root solver (RootSolver or fixed-point Solver instance, or one of "
            f"{', '.join(ROOT_SOLVERS.names() + SOLVERS.names())}), got {type(solver).__name__}"
        )
    return solver


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


def differentiate(
    run: Callable[[int], tuple[State, SolverStats]],
    solver: RootSolver | Solver | Any,
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
    if not isinstance(adjoint, AtFixedPoint):
        raise ValueError(
            f"{adjoint.name} is not available for root / argmin layers; use Implicit, Neumann "
            "(at the solution) or Unroll, Truncated, OneStep (through the iterations)"
        )
    if active_transforms():
        raise NotImplementedError(
            f"{adjoint.name} in a root / argmin layer under torch.func "
            f"({' > '.join(active_transforms())}): these solvers differentiate the problem with "
            "torch.autograd inside (Newton's Jacobian, the minimizers' gradients), which "
            "torch.func transforms cannot trace. Use torch.autograd (loss.backward(), "
            "torch.autograd.grad; create_graph=True for second derivatives)."
        )
    ridge: float = getattr(adjoint, "ridge", 0.0)
    if condition.root_of is not None and ridge:
        raise ValueError(
            "Implicit(ridge > 0) discounts a fixed-point map's Jacobian and has no meaning for "
            "a root / minimum; use ridge=0 (regularise the problem itself instead)"
        )
    with torch.no_grad():
        z, stats = run(0)
    log: list[BackwardStats] = []
    check = FixedPointCheck(
        adjoint.name, adjoint.fixed_point_tol, adjoint.on_divergence, condition.root_of
    )
    solve, rule = adjoint.backward_solve, adjoint.second_order()
    if condition.root_of is None:
        z = attach_fixed_point_gradient(condition.fn, z, spec, solve, log, check, rule)
    else:
        z = attach_root_gradient(
            condition.fn, z, spec, solve, log, check, condition.label, rule
        )
    return z, stats, log


def _minus(z: State, r: State) -> State:
    return tuple(a - b for a, b in zip(z, r, strict=True))
