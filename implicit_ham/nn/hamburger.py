"""The Hamburger block: bread (1x1 convs) around a ham (a matrix-decomposition layer)."""

from __future__ import annotations

from typing import cast

import torch
from torch import Tensor, nn

from implicit_ham._core.validation import check_choice, check_positive_int
from implicit_ham.decompositions.base import Decomposition
from implicit_ham.nn.layers import ActLayer, NormLayer, build_act, build_norm, relu
from implicit_ham.nn.tokens import check_device_and_dtype

VERSIONS = ("v1", "v2", "v2+")


def init_block_weights(module: nn.Module) -> None:
    """Conv weights ``kaiming_normal_(mode="fan_out", nonlinearity="relu")`` (the official
    code's N(0, 2 / (k*k*out_channels))); conv biases keep PyTorch's default; BatchNorm and
    GroupNorm weight 1, bias 0."""
    for m in module.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(m, (nn.BatchNorm2d, nn.GroupNorm)) and m.affine:
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)


class Hamburger(nn.Module):
    """A Hamburger context block, z (B, channels, H, W) -> (B, channels, H, W), or a sequence
    (B, channels, N) -> (B, channels, N) (run as the map (B, channels, N, 1)).

    * lower bread: ``Conv1x1(channels -> width, bias)``, followed by a ReLU only for hams that
      need a non-negative input (NMF), as in the official code; VQ, CD and SVD get the plain
      conv unless ``lower_relu=True``;
    * ham: the decomposition (for v2+ with ``channel_ham``: the lower bread outputs 2 * width
      channels, the first half goes to ``ham`` (spatial), the second to ``channel_ham`` (its
      ``spatial=False``), and the two outputs are concatenated);
    * v1: upper bread ``Conv1x1(width -> channels, no bias) -> BN``; ``out = ReLU(z + upper)``;
    * v2: cheese ``Conv1x1(no bias) -> BN -> ReLU`` between ham and upper bread, upper bread
      ``Conv1x1(no bias)`` without BN; ``out = ReLU(z + upper)``;
    * v2+: as v2, then ``out = ReLU(coef_ham * upper + coef_shortcut * z)`` with learnable
      scalars initialised 0 and 1 (so the block starts as ReLU(z); the parameters before
      ``coef_ham`` receive gradient once ``coef_ham`` has moved away from 0).

    BN and the ReLUs of the cheese and of the output are the defaults of ``norm_layer`` and
    ``act_layer``; the lower bread's ReLU is not an ``act_layer``: it keeps the input of a
    non-negative ham (NMF) in its domain. v1 with ``norm_layer=group_norm(32)`` and
    ``lower_relu=True`` is the Hamburger of SegNeXt's ``LightHamHead``.

    Args:
        channels: input and output channels.
        ham: the decomposition layer (e.g. ``ih.NMF(rank=64)``); its ``groups`` are the S groups.
        version: "v1", "v2" or "v2+".
        ham_channels: width of the ham's input (per ham); default ``channels``.
        channel_ham: v2+ only, a second decomposition with ``spatial=False`` run in parallel.
        lower_relu: ReLU after the lower bread. None (default): the official choice, a ReLU
            exactly when a ham needs a non-negative input (``ham.nonnegative``, NMF). True adds
            it for the other hams too (a departure from the official block); False is refused
            for non-negative hams.
        norm_layer: ``channels -> nn.Module``, the norm after the v1 upper bread and in the v2
            cheese (timm style, see ``implicit_ham.nn.layers``); None: ``nn.BatchNorm2d``.
        act_layer: ``() -> nn.Module``, the activation of the v2 cheese and of the output;
            None: ``nn.ReLU(inplace=True)``.
    """

    def __init__(
        self,
        channels: int,
        ham: Decomposition,
        version: str = "v2",
        *,
        ham_channels: int | None = None,
        channel_ham: Decomposition | None = None,
        lower_relu: bool | None = None,
        norm_layer: NormLayer | None = None,
        act_layer: ActLayer | None = None,
    ) -> None:
        super().__init__()
        check_positive_int("Hamburger", "channels", channels)
        check_choice("Hamburger", "version", version, VERSIONS)
        width = channels if ham_channels is None else ham_channels
        check_positive_int("Hamburger", "ham_channels", width)
        hams = [ham] if channel_ham is None else [ham, channel_ham]
        if lower_relu is None:
            lower_relu = any(getattr(h, "nonnegative", False) for h in hams)
        _check_hams(hams, version, width, lower_relu)
        self.channels, self.width, self.version, self.lower_relu = (
            channels,
            width,
            version,
            lower_relu,
        )
        norm = nn.BatchNorm2d if norm_layer is None else norm_layer
        act = relu if act_layer is None else act_layer
        inner = width * len(hams)
        lower: list[nn.Module] = [nn.Conv2d(channels, inner, 1)]
        if lower_relu:  # in place, on the conv's fresh output: no second map allocated
            lower.append(nn.ReLU(inplace=True))
        self.lower_bread = nn.Sequential(*lower)
        for h in hams:  # "fixed" bases become a buffer drawn once (and exportable)
            h.bind_channels(width)
        self.ham = ham
        self.channel_ham = channel_ham
        if version == "v1":
            self.cheese: nn.Module | None = None
            self.upper_bread: nn.Module = nn.Sequential(
                nn.Conv2d(inner, channels, 1, bias=False),
                build_norm(norm, channels, "Hamburger", "upper bread"),
            )
        else:
            self.cheese = nn.Sequential(
                nn.Conv2d(inner, inner, 1, bias=False),
                build_norm(norm, inner, "Hamburger", "cheese"),
                build_act(act, "Hamburger"),
            )
            self.upper_bread = nn.Conv2d(inner, channels, 1, bias=False)
        self.act = build_act(act, "Hamburger")
        if version == "v2+":
            self.coef_ham = nn.Parameter(torch.zeros(1))
            self.coef_shortcut = nn.Parameter(torch.ones(1))
        init_block_weights(self)

    def forward(self, z: Tensor) -> Tensor:
        """z (B, channels, H, W) -> (B, channels, H, W), any H and W; a sequence z
        (B, channels, N) runs as the map (B, channels, N, 1) (the decompositions' flatten
        rule: n = N positions), so its output equals that map's with the last axis dropped."""
        if z.ndim not in (3, 4):
            raise ValueError(
                f"Hamburger expects a feature map (B, {self.channels}, H, W) or a sequence "
                f"(B, {self.channels}, N), got shape {tuple(z.shape)}; for tokens (B, N, C) use "
                "ih.HamMixer (or z.transpose(1, 2))."
            )
        self._check_input(z)
        if z.ndim == 3:
            return self.forward(z.unsqueeze(-1)).squeeze(-1)
        h = self.lower_bread(z)
        if self.channel_ham is None:
            h = self.ham(h)
        else:
            spatial_part, channel_part = h.chunk(2, dim=1)
            h = torch.cat([self.ham(spatial_part), self.channel_ham(channel_part)], dim=1)
        if self.cheese is not None:
            h = self.cheese(h)
        h = self.upper_bread(h)
        if self.version == "v2+":
            return self.act((self.coef_ham * h).add_(self.coef_shortcut * z))
        return self.act(h.add_(z))  # h: the upper bread's fresh output, not saved by it

    def _check_input(self, z: Tensor) -> None:
        """ValueError / TypeError naming the fix, before the first convolution, for a map z
        (B, C, H, W) or sequence (B, C, N) with C other than ``channels``, or whose dtype
        (outside autocast) or device is not the block's (O(1): the shape and the lower
        bread's weight)."""
        if z.shape[1] != self.channels:
            raise ValueError(
                f"Hamburger(channels={self.channels}) expects (B, {self.channels}, H, W) maps "
                f"or (B, {self.channels}, N) sequences, got shape {tuple(z.shape)}; feed "
                f"{self.channels} channels or build the block with the input's channel count."
            )
        check_device_and_dtype("Hamburger", z, cast(Tensor, self.lower_bread[0].weight))

    def extra_repr(self) -> str:
        dual = ", dual=True" if self.channel_ham is not None else ""
        return (
            f"channels={self.channels}, ham_channels={self.width}, version={self.version!r}{dual}"
        )


def _check_hams(hams: list[Decomposition], version: str, width: int, lower_relu: bool) -> None:
    for ham in hams:
        if not isinstance(ham, Decomposition):
            raise TypeError(
                f"Hamburger: ham must be an ih.Decomposition (e.g. ih.NMF(rank=64)), got "
                f"{type(ham).__name__}"
            )
        if ham.nonnegative and not lower_relu:
            raise ValueError(
                f"Hamburger: {type(ham).__name__} needs a non-negative input; keep "
                "lower_relu=True or choose a ham that accepts signed inputs (VQ, CD, SVD)."
            )
        if ham.channels is not None and ham.channels != width:
            raise ValueError(
                f"Hamburger: the ham was built for channels={ham.channels} but receives "
                f"ham_channels={width}; make them equal."
            )
    if len(hams) == 2:
        if version != "v2+":
            raise ValueError(
                f"Hamburger: channel_ham (dual hams) exists only in version 'v2+', got {version!r}"
            )
        if not hams[0].spatial or hams[1].spatial:
            raise ValueError(
                "Hamburger: with channel_ham, ham must have spatial=True and channel_ham "
                "spatial=False (the channel ham swaps the roles of d and n)."
            )
