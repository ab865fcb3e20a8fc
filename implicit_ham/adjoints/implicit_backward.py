"""Attach a fixed-point gradient to a solution: the autograd.Function behind Implicit and Neumann.

Forward: ``f`` is evaluated once more at the solution z* with gradient enabled (``fz = f(z*)``),
which records how ``f`` depends on its arguments and on any parameters it closes over. The
Function returns z* itself (so the forward value is exactly the solver's), and its backward
receives the incoming gradient v, turns it into an adjoint vector g with a ``BackwardSolve``
(e.g. a linear solve of ``g = J^T g + v``), and hands g to ``fz``'s graph, which carries
``(df/dθ)^T g`` to every argument and parameter. For float16 / bfloat16 states the solve runs in
float32 (``precision.working_dtype``): the VJPs of f run in the state's dtype, the Krylov /
dense algebra in float32, and g is cast back. No tensor hooks: a second backward with
``retain_graph=True`` repeats the solve and returns the same gradient. A backward with
``create_graph=True`` makes the solve itself differentiable when the mode gives a
``SecondOrder`` rule (``Implicit``, ``Neumann``; see ``second_order``) and raises
``SecondOrderError`` otherwise (and for a third derivative), never a second derivative that
holds z* and g constant.

The gradient assumes z* is a fixed point. The evaluation ``fz = f(z*)`` gives its residual
``||f(z*) - z*|| / ||f(z*)||`` per sample for free; the backward pass compares the worst one
with ``FixedPointCheck.tol`` before solving and applies the ``on_divergence`` policy when z* is
not a fixed point (``adjoints.fixed_point_check``: warn ``NotFixedPointWarning``, raise
``NotFixedPointError``, or fall back to the one-step gradient ``g = v``), recording the
residual in the ``BackwardStats``.

The root and argmin layers (``ih.root``, ``ih.minimize``) use the same Function through
``attach_root_gradient``: the graph is that of g at z* (``g = grad_z loss`` for a minimum), the
backward solve is ``(dg/dz)^T w = v`` (posed through ``AdjointOperator.system``), ``-w`` is
handed to g's graph, and the check compares ``||g(z*)||`` with the tolerance.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from implicit_ham._core.errors import (
    BackwardSolveError,
    ConvergenceWarning,
    NonFiniteError,
    SecondOrderError,
)
from implicit_ham._core.events import events
from implicit_ham._core.ill_conditioning import warn_ill_conditioned
from implicit_ham._core.precision import working_dtype
from implicit_ham._core.state import BoundStep, State, StateSpec, StepFn, per_sample_norm
from implicit_ham._core.stats import BackwardStats
from implicit_ham._core.transforms import active_transforms, host_checks
from implicit_ham.adjoints.fixed_point_check import FixedPointCheck, at_fixed_point
from implicit_ham.adjoints.func_gradient import TransformedSolve, attach_under_transforms
from implicit_ham.adjoints.second_order import (
    BackwardSolve,
    SecondOrder,
    as_bound,
    closure_leaves,
    cross_term,
    differentiable_inputs,
    graph_operator,
    vjp,
)
from implicit_ham.linalg.operator import AdjointOperator


def attach_fixed_point_gradient(
    f: StepFn,
    z_star: State,
    spec: StateSpec,
    backward_solve: BackwardSolve,
    log: list[BackwardStats],
    check: FixedPointCheck,
    second_order: SecondOrder | None = None,
) -> State:
    """Return z* (same values) carrying the gradient that ``backward_solve`` defines.

    Args:
        f: the map (tuples in, tuples out), closing over the tensors to differentiate; a
            ``BoundStep`` also names its explicit inputs (needed by second derivatives).
        z_star: the solution, without gradient.
        spec: the state's structure.
        backward_solve: maps (J^T operator, flat incoming gradient v of size M) to the adjoint
            vector g (M,) and its statistics.
        log: each backward's ``BackwardStats`` is appended here.
        check: what to do in backward when z* is not a fixed point of ``f``.
        second_order: how ``create_graph=True`` differentiates the backward pass; None refuses
            it (``SecondOrderError``).
    """
    return _attach(
        f, z_star, spec, backward_solve, log, check, second_order, _relative_change, "I - J"
    )


def _relative_change(fz: State, z: State) -> Tensor:
    """``||f(z) - z|| / ||f(z)||`` per sample, shape ``(batch,)``."""
    change = per_sample_norm(tuple(a - b for a, b in zip(fz, z, strict=True)))
    return change / (per_sample_norm(fz) + torch.finfo(change.dtype).tiny)


def attach_root_gradient(
    g: StepFn,
    z_star: State,
    spec: StateSpec,
    backward_solve: BackwardSolve,
    log: list[BackwardStats],
    check: FixedPointCheck,
    label: str = "dg/dz",
    second_order: SecondOrder | None = None,
) -> State:
    """Return z* (same values) carrying the implicit gradient of a root ``g(z*, θ) = 0``.

    The same Function as ``attach_fixed_point_gradient``, posed on ``g``: the backward pass
    solves ``A^T w = v`` with ``A = dg/dz`` at z* (``backward_solve`` sees ``A^T`` as
    ``AdjointOperator.system``, and ``vjp = I - A^T``, the fixed-point form of ``z - g(z)``)
    and hands ``-w`` to ``g``'s graph, giving ``-(dg/dθ)^T (dg/dz)^{-T} v``. The check
    compares ``||g(z*)||`` (worst sample, absolute) with ``check.tol``.

    Args:
        g: the residual map (tuples in, tuples out, shaped like the state).
        z_star: the root, without gradient.
        label: the system's name in messages (e.g. "dg/dz", "Hessian").
        spec, backward_solve, log, check, second_order: as for
            ``attach_fixed_point_gradient``.
    """
    return _attach(
        g, z_star, spec, backward_solve, log, check, second_order,
        lambda gz, z: per_sample_norm(gz), label,
    )


def _attach(
    fn: StepFn,
    z_star: State,
    spec: StateSpec,
    backward_solve: BackwardSolve,
    log: list[BackwardStats],
    check: FixedPointCheck,
    second_order: SecondOrder | None,
    residual_of: Callable[[State, State], Tensor],
    label: str,
) -> State:
    """What both public functions share: evaluate ``fn`` at z* with a graph, measure the
    residual (``residual_of(fn(z*), z*)``, shape ``(batch,)``, for the check) and attach the
    Function; under torch.func transforms or a whole-graph compile, the ``func_gradient``
    path instead."""
    if not torch.is_grad_enabled():
        return z_star
    bound = as_bound(fn)
    if active_transforms() or _compiled_whole(second_order, check):
        return _under_transforms(bound, z_star, spec, backward_solve, log, check, second_order)
    with torch.enable_grad():
        z_req = tuple(t.detach().requires_grad_() for t in z_star)
        out = bound(z_req)
    if not _reaches_other_leaves(out, z_req):
        return z_star
    with torch.no_grad():
        residual = residual_of(out, z_req)
    backward = _AdjointBackward(
        spec, z_req, out, backward_solve, log, check, residual, label, bound, second_order
    )
    return _FixedPointGradient.apply(backward, *out, *backward.sources())


def _compiled_whole(rule: SecondOrder | None, check: FixedPointCheck) -> bool:
    """Whether ``torch.compile`` traces the gradient into its graph (the ``func_gradient``
    path): for a backward solve without value-dependent control flow (dense, Neumann) and a
    policy that does not change the backward on a failed check (not "fallback"); otherwise the
    Function below runs eagerly between graphs."""
    vmappable = rule is not None and rule.vmappable
    return torch.compiler.is_compiling() and vmappable and check.on_divergence != "fallback"


def _under_transforms(
    bound: BoundStep,
    z_star: State,
    spec: StateSpec,
    backward_solve: BackwardSolve,
    log: list[BackwardStats],
    check: FixedPointCheck,
    rule: SecondOrder | None,
) -> State:
    """The same gradient under torch.func transforms (see ``func_gradient``)."""
    solve = TransformedSolve(
        bound,
        tuple(t.detach() for t in z_star),
        spec,
        backward_solve,
        lambda worst: at_fixed_point(worst, check, spec.batch),
        check.root_of is not None,
        rule is not None and rule.vmappable,
        check.adjoint,
        log,
        checks_point=check.tol is not None,
    )
    return attach_under_transforms(solve)


@dataclass
class _AdjointBackward:
    """What the backward pass needs: the graph of ``f`` at z* (of ``g`` for a root, then
    ``label`` names ``dg/dz``), the adjoint solve, and for ``create_graph=True`` the map with
    its explicit inputs (``bound``) and the ``SecondOrder`` rule. ``partials_only`` is set
    while a cross term is taken (the Function then passes no gradient on)."""

    spec: StateSpec
    z_req: State
    fz: State
    backward_solve: BackwardSolve
    log: list[BackwardStats]
    check: FixedPointCheck
    residual: Tensor
    label: str = "I - J"
    bound: BoundStep | None = None
    rule: SecondOrder | None = None
    partials_only: bool = False
    leaves: list[Tensor] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        if self.rule is not None and self.bound is not None:
            self.leaves = closure_leaves(self.fz, self.z_req, self.bound.inputs)

    def sources(self) -> tuple[Tensor, ...]:
        """The extra inputs of the Function that receive the cross term of a second
        derivative: the explicit inputs requiring grad, then the leaves f closes over."""
        if self.rule is None or self.bound is None:
            return ()
        explicit = differentiable_inputs(self.bound).values()
        return tuple(explicit) + tuple(self.leaves)

    def operator(self, size: int) -> AdjointOperator:
        """``J^T`` of f; for a root, ``A^T = (dg/dz)^T`` as the system (``vjp = I - A^T``)."""
        if self.check.root_of is None:
            return AdjointOperator(self.vjp, self.vjp_batched, size, batch=self.spec.batch)
        return AdjointOperator(
            vjp=lambda x: x - self.vjp(x),
            vjp_batched=lambda rows: rows - self.vjp_batched(rows),
            size=size,
            system=self.vjp,
            system_batched=self.vjp_batched,
            label=self.label,
            batch=self.spec.batch,
        )

    def vjp(self, g: Tensor) -> Tensor:
        """(M,) -> (M,): ``J^T g``, in g's dtype (f's graph runs in the state's dtype)."""
        return vjp(self.spec, self.fz, self.z_req, g, create_graph=False)

    def vjp_batched(self, rows: Tensor) -> Tensor:
        """(P, M) -> (P, M): ``J^T`` applied to each row (vmapped; a loop if vmap fails)."""
        dtype, rows = rows.dtype, rows.to(self.spec.dtype)
        return self._vjp_rows(rows).to(dtype)

    def _vjp_rows(self, rows: Tensor) -> Tensor:
        count, shapes = rows.shape[0], self.spec.shapes
        sizes = [s.numel() // s[0] for s in shapes]
        chunks = torch.split(rows.reshape(count, self.spec.batch, -1), sizes, dim=2)
        stacked = tuple(c.reshape(count, *s) for c, s in zip(chunks, shapes, strict=True))
        try:
            grads = torch.autograd.grad(
                self.fz,
                self.z_req,
                stacked,
                retain_graph=True,
                allow_unused=True,
                is_grads_batched=True,
            )
        except RuntimeError:
            return torch.stack([self.vjp(r) for r in rows])
        parts = [
            torch.zeros_like(c) if gr is None else gr.reshape(count, self.spec.batch, -1)
            for gr, c in zip(grads, chunks, strict=True)
        ]
        return torch.cat(parts, dim=2).reshape(count, -1)

    def __call__(self, grads: tuple[Tensor | None, ...]) -> State:
        v = self._incoming(grads, self.z_req)
        g = self._checked_solve(v, lambda: self.backward_solve(self.operator(v.numel()), v))
        return self._feed(g)

    def differentiable(
        self, grads: tuple[Tensor | None, ...], z_out: State
    ) -> tuple[State, tuple[Tensor | None, ...]]:
        """The backward pass under ``create_graph=True`` (see ``second_order``): the adjoint
        vector with its graph, fed to f's graph, and the cross term for ``sources()``.

        Args:
            grads: the incoming gradient (with its graph). z_out: the Function's outputs.
        """
        if self.rule is None or self.bound is None:
            raise SecondOrderError(
                f"{self.check.adjoint} backward: create_graph=True asks for a derivative of "
                "this backward pass, which it cannot give (a third derivative through an "
                "implicit mode, or a mode without a second-order rule); the result would "
                "silently miss terms. Use Unroll for higher-order gradients."
            )
        v = self._incoming(grads, z_out)
        z_at = tuple(t.view_as(t) for t in z_out)
        with torch.enable_grad():
            out = self.bound(z_at)
        op = graph_operator(
            self.spec, out, z_at, v.numel(), self.check.root_of is not None, self.label
        )
        g = self._checked_solve(v, lambda: self._solve_with_graph(op, v))
        adj = -g if self.check.root_of is not None else g
        cross = cross_term(
            self.bound, self.spec, z_out, adj.detach(), self.leaves, self._partials
        )
        return self._feed(g), cross

    def _solve_with_graph(self, op: AdjointOperator, v: Tensor) -> tuple[Tensor, BackwardStats]:
        rule = self.rule
        assert rule is not None
        if rule.kind == "series":
            return self.backward_solve(op, v)
        g, stats = self.backward_solve(self.operator(v.numel()), v.detach())
        if stats.fallback:
            return v, stats
        return self._adjoint_with_gradient(g, v, op, rule), stats

    def _adjoint_with_gradient(
        self, g: Tensor, v: Tensor, op: AdjointOperator, rule: SecondOrder
    ) -> Tensor:
        """g (M,) carrying the implicit gradient of the root of ``r(g) = A^T g - v``."""
        system = op.system or (lambda x: x - rule.discount * op.vjp(x))
        rows = g.detach().reshape(self.spec.batch, -1)

        def residual(state: State) -> State:
            return ((system(state[0].reshape(-1)) - v).reshape_as(state[0]),)

        assert rule.solve is not None
        check = FixedPointCheck(
            f"{self.check.adjoint} (adjoint)", None, self.check.on_divergence, "A^T g - v"
        )
        (attached,) = attach_root_gradient(
            residual,
            (rows,),
            StateSpec.of(rows),
            rule.solve,
            self.log,
            check,
            f"({self.label})^T",
        )
        return attached.reshape(-1)

    def _partials(
        self, run: Callable[[], tuple[Tensor | None, ...]]
    ) -> tuple[Tensor | None, ...]:
        self.partials_only = True
        try:
            return run()
        finally:
            self.partials_only = False

    def _incoming(self, grads: tuple[Tensor | None, ...], like: State) -> Tensor:
        v_parts = self.spec.zeros_like_missing(grads, like)
        return self.spec.flatten(v_parts).reshape(-1).to(working_dtype(self.spec.dtype))

    def _checked_solve(
        self, v: Tensor, solve: Callable[[], tuple[Tensor, BackwardStats]]
    ) -> Tensor:
        """The fixed-point check, then ``solve()`` (or the one-step fallback g = v); logs."""
        worst = float(self.residual.max()) if self.residual.numel() else 0.0
        if at_fixed_point(worst, self.check, self.spec.batch):
            g, stats = solve()
        else:
            g = v.clone()
            stats = BackwardStats(self.check.adjoint, "none", 0, math.nan, math.nan, None)
            stats = dataclasses.replace(stats, fallback=True)
        stats = dataclasses.replace(
            stats,
            forward_residual=worst,
            at_fixed_point=None if self.check.tol is None else worst <= self.check.tol,
        )
        self.log.append(stats)
        return g

    def _feed(self, g: Tensor) -> State:
        """The adjoint vector in the state's structure, negated for a root: the solution moves
        against g, ``dz/dθ = -(dg/dz)^-1 dg/dθ``."""
        if self.check.root_of is not None:
            g = -g
        return self.spec.unflatten(g.reshape(self.spec.batch, -1).to(self.spec.dtype))


class _FixedPointGradient(torch.autograd.Function):
    """Identity on z* in forward; the adjoint solve in backward (see module docstring).

    Inputs: the graph of f at z* (``fz``), then ``backward.sources()`` (which only receive the
    cross term of a second derivative). The outputs are saved: under ``create_graph=True`` the
    backward pass is built on them, so a later backward pass reaches z*'s own derivative.
    """

    @staticmethod
    def forward(ctx: Any, backward: _AdjointBackward, *inputs: Tensor) -> tuple[Tensor, ...]:
        ctx.backward_solve = backward
        outputs = tuple(t.detach() for t in backward.z_req)
        if backward.rule is not None:
            ctx.save_for_backward(*outputs)
        return outputs

    @staticmethod
    def backward(ctx: Any, *grads: Tensor | None) -> tuple[Tensor | None, ...]:
        backward: _AdjointBackward = ctx.backward_solve
        sources = (None,) * len(backward.sources())
        if backward.partials_only:  # a cross term is being taken: a partial derivative
            return (None,) * (1 + len(backward.fz)) + sources
        if torch.is_grad_enabled():  # backward(create_graph=True): a second derivative is wanted
            fed, cross = backward.differentiable(grads, ctx.saved_tensors)
            return (None, *fed, *(cross or sources))
        with torch.no_grad():
            return (None, *backward(grads), *sources)



def finish_backward(
    op: AdjointOperator,
    v: Tensor,
    g: Tensor,
    *,
    adjoint: str,
    linear_solver: str,
    steps: int,
    tol: float | None,
    cond: float | None,
    on_divergence: str = "warn",
    cond_threshold: float | None = None,
    cond_lower_bound: float | None = None,
    cond_label: str | None = None,
) -> tuple[Tensor, BackwardStats]:
    """Check the adjoint vector g at its true residual; return it (or its fallback) and stats.

    A failed solve is a non-finite g, or (when ``tol`` is given) a residual above ``tol``. On
    failure ``on_divergence`` decides: "warn" (``ConvergenceWarning``; a non-finite g still
    raises ``NonFiniteError``), "raise" (``BackwardSolveError`` / ``NonFiniteError``), or
    "fallback" (warn and return the one-step gradient g = v instead, flagged in the stats).
    ``cond`` is κ exactly (a dense solve), ``cond_lower_bound`` a lower bound of it (GMRES's
    Arnoldi matrices); either above ``cond_threshold`` warns ``ConditioningWarning`` (the
    exact one first) with the error bound ``κ * residual``. ``cond_label``: the system κ is of,
    when not ``op``'s (an exact κ of the unscaled system after a scaled solve).
    """
    bound = cond_lower_bound
    if not host_checks():  # under vmap / while compiling values cannot be read: no checks
        stats = BackwardStats(adjoint, linear_solver, steps, math.nan, math.nan, None, cond)
        return g, dataclasses.replace(stats, cond_lower_bound=bound)
    finite = bool(torch.isfinite(g).all())
    v_norm = float(torch.linalg.vector_norm(v.detach()))
    if v_norm == 0.0 and finite and not bool(g.any()):
        abs_res = 0.0  # g = 0 solves the system exactly; J^T 0 may be NaN where J is not finite
    elif finite:
        abs_res = float(torch.linalg.vector_norm(op.apply(g).detach() - v.detach()))
    else:
        abs_res = float("inf")
    rel_res = abs_res / v_norm if v_norm > 0 else abs_res
    converged = None if tol is None and finite else finite and (tol is None or rel_res <= tol)
    kappa = cond if cond is not None else bound
    if kappa is not None:
        label = op.label if cond is None or cond_label is None else cond_label
        warn_ill_conditioned(
            f"{adjoint} backward", kappa, cond_threshold, linear_solver, label=label,
            exact=cond is not None, residual=rel_res if finite else None,
        )
    stats = BackwardStats(adjoint, linear_solver, steps, abs_res, rel_res, converged, cond)
    stats = dataclasses.replace(stats, cond_lower_bound=bound)
    if converged is not False:
        return g, stats
    problem = (
        f"{adjoint} backward: {linear_solver} "
        + (
            f"did not reach tol={tol:g} in {steps} VJPs (relative residual {rel_res:.3e}"
            if finite
            else f"returned a non-finite adjoint after {steps} VJPs (incoming gradient "
            f"{'finite' if bool(torch.isfinite(v).all()) else 'already non-finite'}"
        )
        + (f", κ({op.label}) = {cond:.3e}" if cond is not None else "")
        + (f", κ({op.label}) >= {bound:.3e}" if bound is not None else "")
        + ")"
    )
    if on_divergence == "fallback":
        events().warn(
            problem + "; using the one-step gradient for this batch (fallback)",
            ConvergenceWarning,
            residual=rel_res if finite else None,
            where=f"{adjoint} backward",
        )
        return v.clone(), dataclasses.replace(stats, fallback=True)
    fix = (
        "Raise max_steps, use another linear solver or backward mode, or on_divergence='fallback'."
    )
    if not finite:
        raise NonFiniteError(f"{problem}; {op.label} is likely singular here. {fix}")
    if on_divergence == "raise":
        raise BackwardSolveError(f"{problem}. {fix}")
    events().warn(
        f"{problem}; the gradient is inaccurate. {fix}",
        ConvergenceWarning,
        residual=rel_res,
        where=f"{adjoint} backward",
    )
    return g, stats


def _reaches_other_leaves(fz: State, z_req: State) -> bool:
    """Whether ``fz`` depends on a tensor requiring grad other than ``z_req`` (args, params)."""
    own = {id(t) for t in z_req}
    stack = [t.grad_fn for t in fz if t.grad_fn is not None]
    seen: set[int] = set()
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        variable = getattr(node, "variable", None)
        if variable is not None:
            if id(variable) not in own:
                return True
            continue
        stack.extend(nxt for nxt, _ in node.next_functions if nxt is not None)
    return False
