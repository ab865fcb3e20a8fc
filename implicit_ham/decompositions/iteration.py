"""``IterationMap``: the fixed-point map of one decomposition problem, with its loop invariants
computed once per solve instead of once per iteration."""

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
        return tuple(step(x, state, self.invariants(x)))
