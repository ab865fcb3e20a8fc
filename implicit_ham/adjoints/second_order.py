"""Second derivatives through the at-fixed-point modes: their backward pass, made differentiable.

Notation: z* the solution (the output of the Function, saved for backward: in a later backward
pass its derivative is the mode's own first-order one, the recursion the chain rule asks for),
θ the tensors the map depends on (``fixed_point``'s args and the leaves it closes over), v the
incoming gradient, ``A^T`` the adjoint system (``I - J^T`` for a fixed point, ``(dg/dz)^T`` for
a root) and u the adjoint vector. The first derivative is ``∂_θ f(z*, θ)^T u`` (``-u`` fed to
g's graph for a root). Under ``create_graph=True`` each of its dependencies is differentiable:

1. **u.** ``"solve"`` rule (``Implicit``): the configured linear solver finds u without a
   graph; u is the root of ``r(u) = A(z*, θ)^T u - v``, and gets that root's implicit gradient
   from the same Function (``attach_root_gradient``), whose own backward pass solves the
   transposed system ``A y = c`` with the same linear solver (``J y`` as a VJP of a VJP).
   ``"series"`` rule (``Neumann``): the k-term series is a fixed sequence of VJPs and is
   differentiated as computed; Neumann's second derivative is the derivative of its k-term
   series, in which z*'s own derivative is again Neumann's k-term series (not the exact
   implicit one), so it tends to Implicit's as k grows.
2. **θ at fixed z\\*.** The graph of f at z* built in forward carries u to θ.
3. **z\\* inside ∂_θ f(z\\*, θ).** A cross term ``C = ∂_θ <∂_z <f(z, θ), u>, z* - sg(z*)>``,
   zero in value, whose derivative along z* is the mixed second derivative of f; it is handed
   to the explicit inputs and to the leaves f closes over (extra inputs of the Function).

Limits: a third derivative is refused (``SecondOrderError``), and so is a mode without a rule
(a plug-in that defines only ``backward_solve``). A non-leaf tensor that f closes over (instead
of receiving it through args) gets no cross term: second derivatives reach the leaves behind it
correctly, but one taken with respect to that tensor itself misses term 3; pass it in args.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from implicit_ham._core.errors import SecondOrderError
from implicit_ham._core.state import BoundStep, State, StateSpec, StepFn
from implicit_ham._core.stats import BackwardStats
from implicit_ham.adjoints.adjoint_system import AdjointSystem, Attachment, RootSystem
from implicit_ham.adjoints.fixed_point_check import FixedPointCheck
from implicit_ham.linalg.operator import AdjointOperator

if TYPE_CHECKING:
    from implicit_ham.adjoints.implicit_backward import AdjointBackward

BackwardSolve = Callable[[AdjointOperator, Tensor], tuple[Tensor, BackwardStats]]
SECOND_ORDER_KINDS = ("solve", "series")


@dataclass(frozen=True)
class SecondOrder:
    """How an at-fixed-point mode's backward pass is differentiated (``create_graph=True``).

    Attributes:
        kind: "solve" (``backward_solve`` returns the solution of its system: differentiated
            implicitly) or "series" (a fixed sequence of operator products: differentiated as
            computed).
        solve: for "solve", the ``BackwardSolve`` of the transposed system (the adjoint
            vector's own implicit gradient), e.g. the same linear solver.
        discount: for "solve" on a fixed point, the factor of ``J^T`` in the system
            ``I - discount * J^T`` (``Implicit(ridge=λ)``: ``1 / (1 + λ)``).
        vmappable: whether ``backward_solve`` has no value-dependent control flow, so that it
            runs under ``torch.func.vmap`` (and jacrev / jacfwd): an exact dense solve or a
            fixed series, not an iteration that stops on a tolerance.
    """

    kind: str
    solve: BackwardSolve | None = None
    discount: float = 1.0
    vmappable: bool = False

    def __post_init__(self) -> None:
        if self.kind not in SECOND_ORDER_KINDS:
            raise ValueError(
                f"SecondOrder: kind must be one of {SECOND_ORDER_KINDS}, got {self.kind!r}"
            )
        if self.kind == "solve" and self.solve is None:
            raise ValueError("SecondOrder: kind='solve' needs the solve of the transposed system")


def as_bound(f: Callable[[State], State]) -> BoundStep:
    """``f`` itself when it keeps its inputs (``BoundStep``), else ``f`` with no explicit ones."""
    return f if isinstance(f, BoundStep) else BoundStep(lambda z, _inputs: f(z), ())


def vjp(spec: StateSpec, out: State, at: State, g: Tensor, create_graph: bool) -> Tensor:
    """(M,) -> (M,): ``(d out / d at)^T g`` flattened, in g's dtype (the graph runs in the
    state's dtype); zeros where ``out`` does not depend on a part of ``at``."""
    grads = torch.autograd.grad(
        out,
        at,
        spec.unflatten(g if g.dtype == spec.dtype else g.to(spec.dtype)),
        retain_graph=True,
        create_graph=create_graph,
        allow_unused=True,
    )
    if len(grads) == 1 and grads[0] is not None:  # one state tensor: no zeros, no concatenation
        flat = grads[0].reshape(-1)
    else:
        flat = spec.flatten(spec.zeros_like_missing(grads, at)).reshape(-1)
    return flat if flat.dtype == g.dtype else flat.to(g.dtype)


def graph_operator(
    spec: StateSpec, out: State, at: State, size: int, system: AdjointSystem
) -> AdjointOperator:
    """The adjoint operator of ``out`` (f or g evaluated at ``at``) whose products carry a
    graph (``create_graph=True``): differentiable in z*, θ and the vector. ``system`` poses it
    as for the first derivative (``J^T`` for a fixed point, ``A^T`` for a root)."""

    def product(x: Tensor) -> Tensor:
        return vjp(spec, out, at, x, create_graph=True)

    def rows(batch: Tensor) -> Tensor:
        return torch.stack([product(r) for r in batch])

    return system.operator(product, rows, size, spec.batch)


def closure_leaves(out: State, own: State, inputs: Sequence[object]) -> list[Tensor]:
    """The leaves requiring grad that ``out``'s graph reaches other than through ``own`` (the
    state) and the explicit ``inputs``: the parameters the map closes over."""
    stop = {id(t.grad_fn) for t in inputs if isinstance(t, Tensor) and t.grad_fn is not None}
    known = {id(t) for t in own} | {id(t) for t in inputs if isinstance(t, Tensor)}
    stack = [t.grad_fn for t in out if t.grad_fn is not None]
    seen: set[int] = set()
    leaves: list[Tensor] = []
    while stack:
        node = stack.pop()
        if id(node) in seen or id(node) in stop:
            continue
        seen.add(id(node))
        variable = getattr(node, "variable", None)
        if variable is not None:
            if id(variable) not in known:
                known.add(id(variable))
                leaves.append(variable)
            continue
        stack.extend(nxt for nxt, _ in node.next_functions if nxt is not None)
    return leaves


def differentiable_inputs(bound: BoundStep) -> dict[int, Tensor]:
    """The explicit inputs that require grad, by position."""
    return {
        i: t for i, t in enumerate(bound.inputs) if isinstance(t, Tensor) and t.requires_grad
    }


def cross_term(
    bound: BoundStep,
    spec: StateSpec,
    z_out: State,
    adj: Tensor,
    leaves: Sequence[Tensor],
    partials: Callable[[Callable[[], tuple[Tensor | None, ...]]], tuple[Tensor | None, ...]],
) -> tuple[Tensor | None, ...]:
    """``C = ∂_θ <∂_z <f(z, θ), adj>, z* - sg(z*)>`` for θ = (the differentiable explicit
    inputs, ``leaves``): zero in value, the mixed second derivative along z* (term 3 of the
    module docstring). ``partials(run)`` runs ``run`` while the Function returns no gradient
    (so the derivative taken here is partial in θ, at fixed z*).

    Args:
        z_out: the Function's output z* (its graph leads back to the Function).
        adj: (M,) the adjoint vector fed to f's graph, without a graph.
    """
    positions = differentiable_inputs(bound)
    if not positions and not leaves:
        return ()
    z_c = tuple(t.detach().requires_grad_() for t in z_out)
    copies = {i: t.detach().requires_grad_() for i, t in positions.items()}
    inputs = tuple(copies.get(i, t) for i, t in enumerate(bound.inputs))
    with torch.enable_grad():
        out = bound.at(z_c, inputs)
        dz_term = torch.autograd.grad(
            out, z_c, spec.unflatten(adj.to(spec.dtype)), create_graph=True, allow_unused=True
        )
        terms = [
            (j * (z - z.detach())).sum()
            for j, z in zip(dz_term, z_out, strict=True)
            if j is not None
        ]
    targets = list(copies.values()) + list(leaves)
    if not terms or not any(t.requires_grad for t in terms):
        return (None,) * len(targets)
    total = torch.stack(terms).sum()
    return partials(
        lambda: torch.autograd.grad(total, targets, create_graph=True, allow_unused=True)
    )


Attach = Callable[[StepFn, State, AdjointSystem, Attachment], State]
Partials = tuple[Tensor | None, ...]


@dataclass
class SecondDerivative:
    """The backward pass under ``create_graph=True`` (the three terms of the module docstring).

    Attributes:
        bound: the map with its explicit inputs.
        rule: the mode's ``SecondOrder`` rule.
        attach: ``implicit_backward.attach_gradient`` (handed in: the adjoint vector's own
            implicit gradient is attached by the same Function, and this module sits below it).
        leaves: the leaves requiring grad that the map closes over (found at construction from
            ``fz``, the map's graph at z*, and ``z_req``, the state it was evaluated at).
        partials_only: set while a cross term is taken (the Function then passes no gradient).
    """

    bound: BoundStep
    rule: SecondOrder
    attach: Attach
    fz: State
    z_req: State
    leaves: list[Tensor] = field(default_factory=list)
    partials_only: bool = False

    def __post_init__(self) -> None:
        self.leaves = closure_leaves(self.fz, self.z_req, self.bound.inputs)

    def sources(self) -> tuple[Tensor, ...]:
        """The extra inputs of the Function that receive the cross term (term 3): the
        explicit inputs requiring grad, then the leaves the map closes over."""
        return tuple(differentiable_inputs(self.bound).values()) + tuple(self.leaves)

    def backward(
        self, first: AdjointBackward, grads: Partials, z_out: State
    ) -> tuple[State, Partials]:
        """The adjoint vector with its graph (term 1), fed to the map's graph at z* (term 2),
        and the cross term for ``sources()`` (term 3).

        Args:
            first: the first-order backward pass (the system, the check, the log).
            grads: the incoming gradient (with its graph). z_out: the Function's outputs.
        """
        v = first.incoming(grads, z_out)
        z_at = tuple(t.view_as(t) for t in z_out)  # a view: the map's graph reaches z*'s own
        with torch.enable_grad():
            out = self.bound(z_at)
        op = graph_operator(first.spec, out, z_at, v.numel(), first.system)
        g = first.checked_solve(v, lambda: self._solve_with_graph(first, op, v))
        adj = first.system.fed(g)
        cross = cross_term(self.bound, first.spec, z_out, adj.detach(), self.leaves, self._partials)
        return first.feed(g), cross

    def _solve_with_graph(
        self, first: AdjointBackward, op: AdjointOperator, v: Tensor
    ) -> tuple[Tensor, BackwardStats]:
        """Term 1. "series": the series run on ``op`` (products with a graph) is its own
        derivative. "solve": the solve runs without a graph, then u gets its implicit gradient."""
        if self.rule.kind == "series":
            return first.setup.backward_solve(op, v)
        g, stats = first.setup.backward_solve(first.operator(v.numel()), v.detach())
        if stats.fallback:
            return v, stats
        return self._adjoint_with_gradient(first, g, v, op), stats

    def _adjoint_with_gradient(
        self, first: AdjointBackward, u: Tensor, v: Tensor, op: AdjointOperator
    ) -> Tensor:
        """u (M,) carrying the implicit gradient of the root of ``r(u) = A^T u - v``: a root
        of r, attached by the same Function, whose backward pass solves ``(dr/du)^T y = c``,
        i.e. the transposed system ``A y = c`` (``J y`` as a VJP of a VJP), with
        ``rule.solve``. ``A^T`` is ``op.system`` for a root, ``I - discount * J^T`` for a fixed
        point (``Implicit(ridge=λ)`` discounts J)."""
        rule = self.rule
        system = op.system or (lambda x: x - rule.discount * op.vjp(x))
        rows = u.detach().reshape(first.spec.batch, -1)

        def residual(state: State) -> State:
            return ((system(state[0].reshape(-1)) - v).reshape_as(state[0]),)

        assert rule.solve is not None
        check = FixedPointCheck(
            f"{first.setup.check.adjoint} (adjoint)",
            None,
            first.setup.check.on_divergence,
            "A^T g - v",
        )
        setup = Attachment(StateSpec.of(rows), rule.solve, first.setup.log, check)
        system_t = RootSystem(f"({first.system.label})^T")
        (attached,) = self.attach(residual, (rows,), system_t, setup)
        return attached.reshape(-1)

    def _partials(self, run: Callable[[], Partials]) -> Partials:
        """Run ``run`` while the Function passes no gradient on (a partial derivative in θ)."""
        self.partials_only = True
        try:
            return run()
        finally:
            self.partials_only = False


def refuse_second_order(adjoint: str) -> SecondOrderError:
    """The error for ``create_graph=True`` through a backward pass without a rule."""
    return SecondOrderError(
        f"{adjoint} backward: create_graph=True asks for a derivative of "
        "this backward pass, which it cannot give (a third derivative through an "
        "implicit mode, or a mode without a second-order rule); the result would "
        "silently miss terms. Use Unroll for higher-order gradients."
    )
