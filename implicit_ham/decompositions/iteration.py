"""``IterationMap``: the fixed-point map of one decomposition problem, with its loop invariants
computed once per solve instead of once per iteration, and a product of the initialisation
handed to the first step that needs it (NMF's ``X^T D0``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

if TYPE_CHECKING:
    from implicit_ham.decompositions.base import Decomposition, State


class IterationMap:
    """``f(state, X) = layer.step_with(X, state, layer.loop_invariants(X))`` for ``fixed_point``.

    The invariants (e.g. VQ's and CD's column norms of X, a full pass over X (B*S, d, n)) are
    memoised per X tensor, per version of X (an in-place change invalidates them) and per grad
    mode: under no-grad they carry no graph, with grad they are part of the graph, so every
    backward mode still differentiates through them (Unroll through their single shared node,
    Implicit through ``f`` re-evaluated at the fixed point). Any other X (a perturbed or
    detached copy a diagnostic passes) gets its own invariants, so ``f`` stays a pure function
    of its arguments. One map belongs to one problem; the memo dies with it.

    Args:
        layer: the decomposition whose ``step_with`` and ``loop_invariants`` this map calls.
    """

    def __init__(self, layer: Decomposition) -> None:
        self.layer = layer
        self._memo: dict[tuple[int, int, bool], tuple[Tensor, Any]] = {}
        self._first: tuple[Tensor, int, Tensor, int, Tensor] | None = None

    def share(self, bases: Tensor, x: Tensor, product: Tensor | None) -> None:
        """Keep ``product``, a quantity of (X, D0) that ``init_shared`` computed anyway, for the
        first call of the map at exactly these tensors (same objects, unchanged versions):
        that call hands it to the layer (``Decomposition.shared_product``) instead of
        recomputing it. Used once (the step may overwrite it in place); any other call, a
        later one, or one under a grad mode the product was not built for, recomputes it, so
        the map stays a pure function of its arguments and the values are bitwise the same."""
        if product is None or self.layer.use_compile or torch.compiler.is_compiling():
            return
        self._first = (bases, bases._version, x, x._version, product)

    def _take(self, state: State, x: Tensor) -> Tensor | None:
        first, self._first = self._first, None
        if first is None:
            return None
        bases, bases_version, x0, x_version, product = first
        if state[0] is not bases or x is not x0:
            self._first = first  # not the call it was kept for: keep it for that one
            return None
        if bases._version != bases_version or x._version != x_version:
            return None
        needs_graph = torch.is_grad_enabled() and (x.requires_grad or bases.requires_grad)
        return None if needs_graph and not product.requires_grad else product

    def invariants(self, x: Tensor) -> Any:
        """``layer.loop_invariants(x)``, computed once per (x, version of x, grad mode); while
        torch.compile traces, recomputed (the compiler removes the repeats itself)."""
        if torch.compiler.is_compiling():
            return self.layer.loop_invariants(x)
        key = (id(x), x._version, torch.is_grad_enabled())
        entry = self._memo.get(key)
        if entry is None or entry[0] is not x:
            entry = (x, self.layer.loop_invariants(x))
            self._memo[key] = entry
        return entry[1]

    def __call__(self, state: State, x: Tensor) -> State:
        step = self.layer.kernel("step_with")
        product = self._take(state, x) if self._first is not None else None
        if product is None:
            return tuple(step(x, state, self.invariants(x)))
        with self.layer.sharing(state[0], x, product):
            return tuple(step(x, state, self.invariants(x)))
