"""``fixed_point_correction``: the loss summed over intermediate states (Bai et al., 2022).

``sum_k w_k * loss_fn(state_k)`` over ``sol.states`` (``ih.fixed_point(..., states=n)``), with
TorchDEQ's weights for k = 0..n-1: "exp" ``gamma^(n-k-1)`` (gamma 0.8), "linear"
``1 - (n-k-1)/n * gamma + bias`` (gamma 0.9), "const" ``c`` (1). The last state has the largest
weight; the sum is not normalised (as in TorchDEQ's ``fp_correction``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from torch import Tensor

WEIGHTS = ("exp", "linear", "const")


def correction_weights(
    n: int, weights: str = "exp", *, gamma: float | None = None, bias: float = 0.0, c: float = 1.0
) -> list[float]:
    """The n weights of ``weights`` (see the module docstring)."""
    if weights == "exp":
        g = 0.8 if gamma is None else gamma
        return [g ** (n - k - 1) for k in range(n)]
    if weights == "linear":
        g = 0.9 if gamma is None else gamma
        return [1 - (n - k - 1) / n * g + bias for k in range(n)]
    if weights == "const":
        return [c] * n
    raise ValueError(f"unknown weights {weights!r}; valid choices: {', '.join(WEIGHTS)}")


def fixed_point_correction(
    loss_fn: Callable[[Any], Tensor],
    states: Sequence[Any],
    weights: str = "exp",
    **options: float,
) -> Tensor:
    """``sum_k w_k * loss_fn(states[k])``.

    Args:
        loss_fn: maps one state (a Tensor or tuple, as ``sol.value``) to a 0-d loss.
        states: ``sol.states`` of a solve with ``states=``; at least one.
        weights: "exp", "linear" or "const". **options: ``gamma``, ``bias`` (linear), ``c``
            (const).
    """
    if not states:
        raise ValueError(
            "fixed_point_correction needs at least one state: solve with ih.fixed_point(..., "
            "states=n) and pass sol.states"
        )
    w = correction_weights(len(states), weights, **options)
    total = w[0] * loss_fn(states[0])
    for weight, state in zip(w[1:], states[1:], strict=True):
        total = total + weight * loss_fn(state)
    return total
