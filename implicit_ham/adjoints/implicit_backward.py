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

The pieces: ``adjoint_system`` (``FixedPointSystem`` / ``RootSystem``: the residual, the
system and the sign; ``Attachment``: what a backward pass is given), ``AdjointBackward`` here
(the first derivative), ``second_order.SecondDerivative`` (``create_graph=True``) and
``backward_check.finish_backward`` (the check after a mode's solve).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from implicit_ham._core.precision import working_dtype
from implicit_ham._core.state import BoundStep, State, StateSpec, StepFn
from implicit_ham._core.stats import BackwardStats
from implicit_ham._core.transforms import active_transforms
from implicit_ham.adjoints.adjoint_system import (
    AdjointSystem,
    Attachment,
    FixedPointSystem,
    RootSystem,
)
from implicit_ham.adjoints.fixed_point_check import FixedPointCheck, at_fixed_point
from implicit_ham.adjoints.func_gradient import TransformedSolve, attach_under_transforms
from implicit_ham.adjoints.second_order import (
    SecondDerivative,
    SecondOrder,
    as_bound,
    refuse_second_order,
    vjp,
)
from implicit_ham.linalg.operator import AdjointOperator

Grads = tuple[Tensor | None, ...]


def attach_fixed_point_gradient(f: StepFn, z_star: State, setup: Attachment) -> State:
    """Return z* (same values) carrying the gradient of a fixed point ``z* = f(z*)`` that
    ``setup.backward_solve`` defines (``FixedPointSystem``: it sees ``J^T`` and solves
    ``(I - J)^T g = v``, g is fed to f's graph).

    Args:
        f: the map (tuples in, tuples out), closing over the tensors to differentiate; a
            ``BoundStep`` also names its explicit inputs (needed by second derivatives).
        z_star: the solution, without gradient.
        setup: the state's spec, the backward solve, the log, the check and the
            ``SecondOrder`` rule (``adjoint_system.Attachment``).
    """
    return attach_gradient(f, z_star, FixedPointSystem(), setup)


def attach_root_gradient(
    g: StepFn, z_star: State, setup: Attachment, label: str = "dg/dz"
) -> State:
    """Return z* (same values) carrying the implicit gradient of a root ``g(z*, θ) = 0``.

    The same Function as ``attach_fixed_point_gradient``, posed on ``g`` (``RootSystem``): the
    backward pass solves ``A^T w = v`` with ``A = dg/dz`` at z* (``backward_solve`` sees
    ``A^T`` as ``AdjointOperator.system``, and ``vjp = I - A^T``, the fixed-point form of
    ``z - g(z)``) and hands ``-w`` to ``g``'s graph, giving ``-(dg/dθ)^T (dg/dz)^{-T} v``. The
    check compares ``||g(z*)||`` (worst sample, absolute) with ``setup.check.tol``.

    Args:
        g: the residual map (tuples in, tuples out, shaped like the state).
        z_star: the root, without gradient.
        setup: as for ``attach_fixed_point_gradient``.
        label: the system's name in messages (e.g. "dg/dz", "Hessian").
    """
    return attach_gradient(g, z_star, RootSystem(label), setup)


def attach_gradient(
    fn: StepFn, z_star: State, system: AdjointSystem, setup: Attachment
) -> State:
    """What both public functions share: evaluate ``fn`` at z* with a graph, measure the
    residual (``system.residual(fn(z*), z*)``, shape ``(batch,)``, for the check) and attach
    the Function; under torch.func transforms or a whole-graph compile, the ``func_gradient``
    path instead."""
    if not torch.is_grad_enabled():
        return z_star
    bound = as_bound(fn)
    if active_transforms() or _compiled_whole(setup.rule, setup.check):
        return _under_transforms(bound, z_star, system, setup)
    with torch.enable_grad():
        z_req = tuple(t.detach().requires_grad_() for t in z_star)
        out = bound(z_req)
    if not _reaches_other_leaves(out, z_req):
        return z_star
    with torch.no_grad():
        residual = system.residual(out, z_req)
    second = None
    if setup.rule is not None:
        second = SecondDerivative(bound, setup.rule, attach_gradient, out, z_req)
    backward = AdjointBackward(setup, system, z_req, out, residual, second)
    return _FixedPointGradient.apply(backward, *out, *backward.sources())


def _compiled_whole(rule: SecondOrder | None, check: FixedPointCheck) -> bool:
    """Whether ``torch.compile`` traces the gradient into its graph (the ``func_gradient``
    path): for a backward solve without value-dependent control flow (dense, Neumann) and a
    policy that does not change the backward on a failed check (not "fallback"); otherwise the
    Function below runs eagerly between graphs."""
    vmappable = rule is not None and rule.vmappable
    return torch.compiler.is_compiling() and vmappable and check.on_divergence != "fallback"


def _under_transforms(
    bound: BoundStep, z_star: State, system: AdjointSystem, setup: Attachment
) -> State:
    """The same gradient under torch.func transforms (see ``func_gradient``)."""
    check, rule, spec = setup.check, setup.rule, setup.spec
    solve = TransformedSolve(
        bound,
        tuple(t.detach() for t in z_star),
        spec,
        setup.backward_solve,
        lambda worst: at_fixed_point(worst, check, spec.batch),
        system.root,
        rule is not None and rule.vmappable,
        check.adjoint,
        setup.log,
        checks_point=check.tol is not None,
    )
    return attach_under_transforms(solve)


@dataclasses.dataclass
class AdjointBackward:
    """The first-order backward pass: the graph of the map at z* (``fz``, evaluated at
    ``z_req``), the condition's ``system``, the forward ``residual`` per sample (for the
    check), and for ``create_graph=True`` the ``second`` derivative's pieces (None: refused).
    """

    setup: Attachment
    system: AdjointSystem
    z_req: State
    fz: State
    residual: Tensor
    second: SecondDerivative | None = None

    @property
    def spec(self) -> StateSpec:
        return self.setup.spec

    def sources(self) -> tuple[Tensor, ...]:
        """The Function's extra inputs (only a second derivative's cross term reaches them)."""
        return () if self.second is None else self.second.sources()

    def operator(self, size: int) -> AdjointOperator:
        """The adjoint operator of the condition at z*, its products VJPs through ``fz``
        without a graph (``J^T`` for a fixed point, ``A^T = (dg/dz)^T`` for a root)."""
        return self.system.operator(self.vjp, self.vjp_batched, size, self.spec.batch)

    def vjp(self, g: Tensor) -> Tensor:
        """(M,) -> (M,): ``(d fz / d z)^T g``, in g's dtype (the graph runs in the state's
        dtype)."""
        return vjp(self.spec, self.fz, self.z_req, g, create_graph=False)

    def vjp_batched(self, rows: Tensor) -> Tensor:
        """(P, M) -> (P, M): the same transpose applied to each row (vmapped; a loop if vmap
        fails)."""
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

    def __call__(self, grads: Grads) -> State:
        """The first derivative: solve the adjoint system for the incoming gradient v, and
        hand the adjoint vector (signed by the system) to the map's graph."""
        v = self.incoming(grads, self.z_req)
        solve = self.setup.backward_solve
        g = self.checked_solve(v, lambda: solve(self.operator(v.numel()), v))
        return self.feed(g)

    def differentiable(self, grads: Grads, z_out: State) -> tuple[State, Grads]:
        """The backward pass under ``create_graph=True`` (``second_order.SecondDerivative``):
        the fed adjoint vector with its graph and the cross term for ``sources()``."""
        if self.second is None:
            raise refuse_second_order(self.setup.check.adjoint)
        return self.second.backward(self, grads, z_out)

    def incoming(self, grads: Grads, like: State) -> Tensor:
        """The incoming gradient v, flat (M,), in the working dtype (float32 for half states)."""
        v_parts = self.spec.zeros_like_missing(grads, like)
        return self.spec.flatten(v_parts).reshape(-1).to(working_dtype(self.spec.dtype))

    def checked_solve(
        self, v: Tensor, solve: Callable[[], tuple[Tensor, BackwardStats]]
    ) -> Tensor:
        """The fixed-point check, then ``solve()`` (or the one-step fallback g = v); logs."""
        check = self.setup.check
        worst = float(self.residual.max()) if self.residual.numel() else 0.0
        if at_fixed_point(worst, check, self.spec.batch):
            g, stats = solve()
        else:
            g = v.clone()
            stats = BackwardStats(check.adjoint, "none", 0, math.nan, math.nan, None)
            stats = dataclasses.replace(stats, fallback=True)
        stats = dataclasses.replace(
            stats,
            forward_residual=worst,
            at_fixed_point=None if check.tol is None else worst <= check.tol,
        )
        self.setup.log.append(stats)
        return g

    def feed(self, g: Tensor) -> State:
        """The adjoint vector as the map's graph receives it: signed by the system (negated
        for a root: the solution moves against g, ``dz/dθ = -(dg/dz)^-1 dg/dθ``), in the
        state's structure and dtype."""
        g = self.system.fed(g)
        return self.spec.unflatten(g.reshape(self.spec.batch, -1).to(self.spec.dtype))


class _FixedPointGradient(torch.autograd.Function):
    """Identity on z* in forward; the adjoint solve in backward (see module docstring).

    Inputs: the graph of f at z* (``fz``), then ``backward.sources()`` (which only receive the
    cross term of a second derivative). The outputs are saved: under ``create_graph=True`` the
    backward pass is built on them, so a later backward pass reaches z*'s own derivative.
    """

    @staticmethod
    def forward(ctx: Any, backward: AdjointBackward, *inputs: Tensor) -> tuple[Tensor, ...]:
        ctx.backward_solve = backward
        outputs = tuple(t.detach() for t in backward.z_req)
        if backward.second is not None:
            ctx.save_for_backward(*outputs)
        return outputs

    @staticmethod
    def backward(ctx: Any, *grads: Tensor | None) -> tuple[Tensor | None, ...]:
        backward: AdjointBackward = ctx.backward_solve
        sources = (None,) * len(backward.sources())
        second = backward.second
        if second is not None and second.partials_only:  # a cross term is being taken
            return (None,) * (1 + len(backward.fz)) + sources
        if torch.is_grad_enabled():  # backward(create_graph=True): a second derivative is wanted
            fed, cross = backward.differentiable(grads, ctx.saved_tensors)
            return (None, *fed, *(cross or sources))
        with torch.no_grad():
            return (None, *backward(grads), *sources)


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
