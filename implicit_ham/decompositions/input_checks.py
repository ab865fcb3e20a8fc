"""The input and value checks of a decomposition layer, as plain functions of what they read:
a floating-point input (``check_floating``), the range of X in one pass (``value_range``: NaN
and infinity show in it), the channels' divisibility by the groups (``check_groups``), a rank below
min(d, n) (``check_rank``) and ``check_values``, the checks ``Decomposition.implicit_problem``
runs on X (B*S, d, n) before each solve (non-finite first, then the rank, then the sign). Each
error names the layer (``owner``, its class name) and says how to fix the input.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from implicit_ham._core.errors import NonFiniteError
from implicit_ham._core.transforms import host_checks


def value_range(x: Tensor, *others: Tensor) -> list[float]:
    """``[min(x), max(x), min(others[0]), ...]`` in one pass over x (``aminmax`` propagates
    NaN, so a NaN anywhere in x makes both non-finite) and one host synchronisation."""
    low, high = torch.aminmax(x.detach())
    return torch.stack([low, high, *(t.detach().amin() for t in others)]).tolist()


def check_floating(owner: str, x: Tensor) -> None:
    """TypeError unless x is a floating-point tensor (the solve needs real arithmetic)."""
    if not x.is_floating_point():
        raise TypeError(
            f"{owner}: x must be a floating-point tensor, got {x.dtype}; "
            "convert it first, e.g. x.float()"
        )


def check_groups(owner: str, channels: int, groups: int) -> None:
    """ValueError unless ``channels`` (C) is divisible by ``groups`` (S)."""
    if channels % groups:
        raise ValueError(
            f"{owner}: channels={channels} is not divisible by "
            f"groups={groups}; choose groups that divide the channel count."
        )


def check_rank(owner: str, x: Tensor, rank: int, spatial: bool) -> None:
    """ValueError unless ``rank`` is below min(d, n) for X (B*S, d, n) (``spatial`` names the
    layout in the message)."""
    _, d, n = x.shape
    if rank >= min(d, n):
        raise ValueError(
            f"{owner}: rank={rank} must be smaller than min(d, n) = "
            f"min({d}, {n}) (layout {'spatial' if spatial else 'channel'}: d x n = "
            f"{d} x {n}, X of shape {tuple(x.shape)}); a rank-{rank} factorisation is "
            "then not low-rank. Lower the rank or the groups, or feed a larger feature map "
            "or a longer sequence (n = H*W of a map, N of a sequence)."
        )


def check_values(
    owner: str, x: Tensor, bases: Tensor, *, rank: int, spatial: bool, nonnegative: bool
) -> None:
    """NonFiniteError if X (B*S, d, n) holds NaN / inf; ValueError if ``rank`` is not below
    min(d, n); when ``nonnegative``, ValueError if X or the initial bases (B*S, d, r) hold a
    negative value. One pass over X (``aminmax``, which propagates NaN) and one host
    synchronisation for both value checks (none under vmap / compile, where values cannot be
    read). The rank check runs between the two (the order of precedence: non-finite, rank,
    sign)."""
    low, high, *base_low = (
        value_range(x, *([bases] if nonnegative else []))
        if x.numel() and host_checks()
        else (0.0, 0.0)
    )
    if not (math.isfinite(low) and math.isfinite(high)):
        raise NonFiniteError(
            f"{owner}: the input contains NaN or infinity; check the layer "
            "that produces it (or the data) before the decomposition."
        )
    check_rank(owner, x, rank, spatial)
    for what, value in zip(("input", "initial bases"), (low, *base_low), strict=False):
        if nonnegative and value < 0:
            raise ValueError(
                f"{owner} needs a non-negative {what}, got a minimum of "
                f"{value:.3g}; put a ReLU in front of it (Hamburger's lower bread does) or "
                "use VQ / CD."
            )
