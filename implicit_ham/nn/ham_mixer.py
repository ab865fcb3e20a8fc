"""``HamMixer``: a Hamburger as the token mixer of a pre-norm transformer block."""

from __future__ import annotations

from typing import cast

from torch import Tensor, nn

from implicit_ham._core.validation import check_positive_int
from implicit_ham.decompositions.base import Decomposition
from implicit_ham.nn.tokens import check_device_and_dtype, check_tokens


class HamMixer(nn.Module):
    """A matrix decomposition as a token mixer: tokens x (B, N, C) -> (B, N, C).

    It takes the place of attention in a pre-norm block ``x = x + mixer(norm(x))``: like
    ``nn.MultiheadAttention(batch_first=True)`` it returns the mixing term only (no residual,
    no norm; the block adds them). The bread of the ``Hamburger`` block as linear maps on the
    channels:

    * lower bread ``Linear(channels -> width)``, then a ReLU for a ham that needs a
      non-negative input (NMF), as in the official Hamburger;
    * ham: the decomposition of the sequence (B, width, N), i.e. X (B*S, width/S, N): bases
      over the channels, one coefficient row per token (the decompositions' flatten rule for
      sequences), its low-rank reconstruction back to (B, N, width);
    * upper bread ``Linear(width -> channels)``.

    What it sees: it is **bidirectional**. The bases are fitted to the whole sequence, so every
    output token depends on every input token, earlier and later (as attention without a
    mask). A task scored at every position (language modelling) would read its targets from the
    input; it needs a causal mixer, which this is not (a causal decomposition would refit the
    bases for each of the N prefixes). Tasks that score only the final position, whose target
    is not in the input (the H3 synthetic tasks as the experiments use them), are sound.

    Args:
        channels: C, the token width.
        ham: the decomposition (e.g. ``ih.NMF(rank=8, channels=width)``); its ``spatial=True``
            (the default) decomposes over tokens. ``make_context("nmf_mixer", C, ...)`` builds
            one by name.
        ham_channels: width of the ham's input; default ``channels``.
        lower_relu: ReLU after the lower bread; None (default): exactly when the ham needs a
            non-negative input (``ham.nonnegative``); False is refused for such a ham.
        bias: biases of the two linear maps.
    """

    def __init__(
        self,
        channels: int,
        ham: Decomposition,
        *,
        ham_channels: int | None = None,
        lower_relu: bool | None = None,
        bias: bool = True,
    ) -> None:
        super().__init__()
        width = channels if ham_channels is None else ham_channels
        check_positive_int("HamMixer", "channels", channels)
        check_positive_int("HamMixer", "ham_channels", width)
        if not isinstance(ham, Decomposition):
            raise TypeError(
                "HamMixer: ham must be an ih.Decomposition (e.g. ih.NMF(rank=8)), got "
                f"{type(ham).__name__}"
            )
        if lower_relu is None:
            lower_relu = ham.nonnegative
        if ham.nonnegative and not lower_relu:
            raise ValueError(
                f"HamMixer: {type(ham).__name__} needs a non-negative input; keep "
                "lower_relu=True or choose a ham that accepts signed inputs (VQ, CD, SVD)."
            )
        if not ham.spatial:
            raise ValueError(
                "HamMixer: the ham must have spatial=True (bases over channels, coefficients "
                "per token); spatial=False would decompose the channels."
            )
        self.channels, self.width, self.lower_relu = channels, width, bool(lower_relu)
        lower: list[nn.Module] = [nn.Linear(channels, width, bias=bias)]
        if lower_relu:
            lower.append(nn.ReLU())
        self.lower_bread = nn.Sequential(*lower)
        ham.bind_channels(width)  # "fixed" bases become a buffer drawn once (and exportable)
        self.ham = ham
        self.upper_bread = nn.Linear(width, channels, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        """x (B, N, channels) -> the mixing term (B, N, channels)."""
        check_tokens("HamMixer", x, self.channels)
        check_device_and_dtype("HamMixer", x, cast(Tensor, self.lower_bread[0].weight))
        h = self.lower_bread(x).transpose(1, 2)  # (B, width, N): the ham's sequence layout
        return self.upper_bread(self.ham(h).transpose(1, 2))

    def extra_repr(self) -> str:
        return f"channels={self.channels}, ham_channels={self.width}"
