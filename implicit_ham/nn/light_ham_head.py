"""SegNeXt's decode head, ``LightHamHead``: multi-level features -> one Hamburger -> logits.

The head most Hamburger users run today (SegNeXt, and mmsegmentation's
``mmseg/models/decode_heads/ham_head.py``). The computation, in mmseg's order::

    feats  = [inputs[i] for i in in_index]                       # (B, C_i, H_i, W_i)
    x      = cat([bilinear_resize(f, size of feats[0]) for f in feats], channels)
    x      = squeeze(x)        # Conv1x1(sum C_i -> ham_channels, no bias) -> GN(32) -> ReLU
    x      = hamburger(x)      # Conv1x1(bias) -> ReLU -> NMF -> Conv1x1(no bias) -> GN(32);
                               # ReLU(x + that)
    x      = align(x)          # Conv1x1(ham_channels -> channels, no bias) -> GN(32) -> ReLU
    logits = conv_seg(dropout2d(x))                              # (B, num_classes, H_0, W_0)

A conv has a bias exactly where no norm follows it (mmcv's ``ConvModule`` rule). The
Hamburger is this library's ``Hamburger`` in version "v1" with the lower ReLU always on and
the norm injected. ``segnext_nmf`` builds the ham as SegNeXt configures it.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from implicit_ham._core.validation import check_positive_int
from implicit_ham.adjoints.modes import Unroll
from implicit_ham.decompositions.base import Decomposition
from implicit_ham.decompositions.nmf import NMF
from implicit_ham.nn.hamburger import Hamburger
from implicit_ham.nn.layers import ActLayer, NormLayer, build_act, build_norm, group_norm, relu

SEGNEXT_RANK = 16


def segnext_nmf(channels: int, rank: int = SEGNEXT_RANK, **overrides: Any) -> NMF:
    """The NMF ham of SegNeXt's ``LightHamHead`` on ``channels`` channels (d = channels).

    SegNeXt's ``NMF2D``: S = 1 group, 6 training and 7 evaluation steps, initial bases
    ``torch.rand`` normalised over d and drawn at every forward, eps 1e-6, and a softmax
    temperature of 1 (``NMF2D`` overwrites whatever ``inv_t`` its config gives, so
    ``inv_t`` is refused here). Its gradient runs through every iteration (the SegNeXt code
    does not detach them), hence ``adjoint=Unroll()``.

    Args:
        channels: the ham's input channels (the head's ``ham_channels``).
        rank: R. 16 is what the SegNeXt-T and -S configurations set (``MD_R=16``); the -B and
            -L configurations keep the class default, 64.
        **overrides: any other ``NMF`` option, e.g. ``eval_init="fixed"`` for a deterministic
            evaluation or ``adjoint=ih.OneStep()`` for the paper's one-step gradient.
    """
    if "inv_t" in overrides:
        raise TypeError(
            "segnext_nmf: SegNeXt's NMF always uses a softmax temperature of 1 (its NMF2D "
            "ignores the configured inv_t); build ih.NMF(inv_t=...) yourself for another one."
        )
    options: dict[str, Any] = {
        "groups": 1,
        "steps": 6,
        "eval_steps": 7,
        "adjoint": Unroll(),
        "channels": channels,
    }
    options.update(overrides)
    return NMF(rank, inv_t=1.0, **options)


def conv_norm_act(
    in_channels: int,
    out_channels: int,
    norm_layer: NormLayer,
    act_layer: ActLayer | None,
    owner: str,
    where: str,
) -> nn.Sequential:
    """mmcv's ``ConvModule`` with a norm: ``conv`` (1x1, no bias) -> ``norm`` -> ``act`` (if
    ``act_layer``), as an ``nn.Sequential`` with those child names."""
    layers: OrderedDict[str, nn.Module] = OrderedDict()
    layers["conv"] = nn.Conv2d(in_channels, out_channels, 1, bias=False)
    layers["norm"] = build_norm(norm_layer, out_channels, owner, where)
    if act_layer is not None:
        layers["act"] = build_act(act_layer, owner)
    return nn.Sequential(layers)


class LightHamHead(nn.Module):
    """SegNeXt's decode head (see the module docstring for the computation).

    Args:
        in_channels: C_i of each selected level, in ``in_index`` order (SegNeXt-T:
            ``[64, 160, 256]``).
        channels: width of the ``align`` output fed to the classifier (SegNeXt-T: 256).
        num_classes: output channels of the classifier ``conv_seg``.
        in_index: which levels of the input list are used, in order; the output has the size
            of the first. None: every level, ``range(len(in_channels))``. SegNeXt: ``[1, 2, 3]``
            (strides 8, 16, 32 of the MSCAN backbone).
        ham_channels: width of ``squeeze`` and of the Hamburger (SegNeXt-T: 256).
        ham: the decomposition; None: ``segnext_nmf(ham_channels)`` (R = 16). Its ``channels``,
            if set, must equal ``ham_channels``.
        dropout_ratio: ``nn.Dropout2d`` probability before the classifier (0: none).
        align_corners: of the bilinear resizing of the levels.
        norm_layer: ``channels -> nn.Module`` for ``squeeze``, ``align`` and the Hamburger's
            upper bread; None: ``group_norm(32)`` (SegNeXt's ``dict(type="GN",
            num_groups=32)``).
        act_layer: ``() -> nn.Module`` for ``squeeze`` and ``align``; None:
            ``nn.ReLU(inplace=True)``. The Hamburger's two ReLUs are fixed, as in SegNeXt.

    Weights are initialised as mmseg does: convs ``kaiming_normal_(mode="fan_out",
    nonlinearity="relu")`` with zero biases, norms weight 1 and bias 0, ``conv_seg`` normal with
    std 0.01 and zero bias. ``mmseg_state_dict`` converts an mmseg / SegNeXt checkpoint.
    """

    def __init__(
        self,
        in_channels: Sequence[int],
        channels: int,
        *,
        num_classes: int,
        in_index: Sequence[int] | None = None,
        ham_channels: int = 512,
        ham: Decomposition | None = None,
        dropout_ratio: float = 0.1,
        align_corners: bool = False,
        norm_layer: NormLayer | None = None,
        act_layer: ActLayer | None = None,
    ) -> None:
        super().__init__()
        owner = "LightHamHead"
        self.in_channels = _int_list(owner, "in_channels", in_channels, minimum=1)
        if not self.in_channels:
            raise ValueError(f"{owner}: in_channels must list at least one level")
        index = range(len(self.in_channels)) if in_index is None else in_index
        self.in_index = _int_list(owner, "in_index", index, minimum=None)
        if len(self.in_index) != len(self.in_channels):
            raise ValueError(
                f"{owner}: in_index {self.in_index} selects {len(self.in_index)} levels but "
                f"in_channels {self.in_channels} gives {len(self.in_channels)}; give one "
                "channel count per selected level."
            )
        for name, value in (
            ("channels", channels),
            ("num_classes", num_classes),
            ("ham_channels", ham_channels),
        ):
            check_positive_int(owner, name, value)
        if isinstance(dropout_ratio, bool) or not 0 <= dropout_ratio < 1:
            raise ValueError(f"{owner}: dropout_ratio must lie in [0, 1), got {dropout_ratio!r}")
        self.channels, self.num_classes, self.ham_channels = channels, num_classes, ham_channels
        self.align_corners = bool(align_corners)
        norm = group_norm(32) if norm_layer is None else norm_layer
        act = relu if act_layer is None else act_layer
        self.squeeze = conv_norm_act(
            sum(self.in_channels), ham_channels, norm, act, owner, "squeeze"
        )
        self.hamburger = Hamburger(
            ham_channels,
            segnext_nmf(ham_channels) if ham is None else ham,
            "v1",
            lower_relu=True,
            norm_layer=norm,
        )
        self.align = conv_norm_act(ham_channels, channels, norm, act, owner, "align")
        self.dropout: nn.Module = nn.Dropout2d(dropout_ratio) if dropout_ratio else nn.Identity()
        self.conv_seg = nn.Conv2d(channels, num_classes, 1)
        self.reset_parameters()

    @property
    def ham(self) -> Decomposition:
        """The Hamburger's decomposition."""
        return self.hamburger.ham

    def reset_parameters(self) -> None:
        """mmseg's initialisation (see the class docstring)."""
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.GroupNorm | nn.BatchNorm2d) and m.affine:
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        nn.init.normal_(self.conv_seg.weight, std=0.01)
        nn.init.zeros_(self.conv_seg.bias)  # type: ignore[arg-type]  # a conv with bias

    def forward(self, inputs: Sequence[Tensor]) -> Tensor:
        """inputs: the backbone's levels, a list / tuple of (B, C_i, H_i, W_i) ->
        logits (B, num_classes, H, W) at the size of the first selected level."""
        feats = self.select(inputs)
        size = feats[0].shape[2:]
        x = torch.cat(
            [
                F.interpolate(f, size=size, mode="bilinear", align_corners=self.align_corners)
                for f in feats
            ],
            dim=1,
        )
        x = self.squeeze(x)
        x = self.hamburger(x)
        x = self.align(x)
        return self.conv_seg(self.dropout(x))

    def select(self, inputs: Sequence[Tensor]) -> list[Tensor]:
        """The levels ``in_index`` of ``inputs``, checked against ``in_channels`` and against
        each other (4-D, one batch size, non-empty spatial size)."""
        if not isinstance(inputs, list | tuple) or not all(isinstance(t, Tensor) for t in inputs):
            raise TypeError(
                "LightHamHead expects a list or tuple of feature maps (B, C_i, H_i, W_i), got "
                f"{type(inputs).__name__}; pass the backbone's list of levels."
            )
        levels = len(inputs)
        bad = [i for i in self.in_index if not -levels <= i < levels]
        if bad:
            raise ValueError(
                f"LightHamHead: in_index {self.in_index} selects level(s) {bad}, but the input "
                f"has {levels} level(s) (indices 0..{levels - 1}); pass all the backbone's "
                "levels or change in_index."
            )
        feats = [inputs[i] for i in self.in_index]
        for i, f, expected in zip(self.in_index, feats, self.in_channels, strict=True):
            if f.ndim != 4:
                raise ValueError(
                    f"LightHamHead: level {i} has shape {tuple(f.shape)}, not (B, C, H, W); "
                    "the levels cannot be resized to one size."
                )
            if f.shape[1] != expected:
                raise ValueError(
                    f"LightHamHead: level {i} has {f.shape[1]} channels but in_channels says "
                    f"{expected}; set in_channels to {[g.shape[1] for g in feats]} for these "
                    "inputs (or fix in_index)."
                )
        shapes = [tuple(f.shape) for f in feats]
        if len({s[0] for s in shapes}) > 1 or any(0 in s[2:] for s in shapes):
            raise ValueError(
                f"LightHamHead: the selected levels {shapes} cannot be aligned: they need one "
                "batch size and non-empty spatial sizes to be resized to the first level and "
                "concatenated."
            )
        return feats

    def extra_repr(self) -> str:
        return (
            f"in_channels={self.in_channels}, in_index={self.in_index}, "
            f"channels={self.channels}, ham_channels={self.ham_channels}, "
            f"num_classes={self.num_classes}, align_corners={self.align_corners}"
        )


_MMSEG_KEYS = (  # mmseg name (norm suffix gn / bn / ln ...) -> this head's name
    (r"^squeeze\.conv\.", "squeeze.conv."),
    (r"^squeeze\.[a-z]+\.", "squeeze.norm."),
    (r"^align\.conv\.", "align.conv."),
    (r"^align\.[a-z]+\.", "align.norm."),
    (r"^hamburger\.ham_in\.conv\.", "hamburger.lower_bread.0."),
    (r"^hamburger\.ham_out\.conv\.", "hamburger.upper_bread.0."),
    (r"^hamburger\.ham_out\.[a-z]+\.", "hamburger.upper_bread.1."),
    (r"^hamburger\.ham\.bases$", "hamburger.ham.fixed_bases"),
    (r"^conv_seg\.", "conv_seg."),
)


def mmseg_state_dict(
    state: Mapping[str, Tensor], prefix: str = "decode_head."
) -> dict[str, Tensor]:
    """An mmseg / SegNeXt ``LightHamHead`` state dict in this head's names.

    Args:
        state: the head's own state dict, or a whole segmentor's (then only the keys under
            ``prefix`` are taken; the backbone's and an auxiliary head's are left out).
        prefix: the head's prefix in a segmentor checkpoint.

    mmseg's ``hamburger.ham.bases`` (the initial bases of ``rand_init=False``, fixed once drawn)
    becomes ``hamburger.ham.fixed_bases``: load it into a head whose ham has ``eval_init`` (or
    ``init``) "fixed". A checkpoint trained with random bases (SegNeXt's default) has none; a
    "fixed" head then keeps its own seeded bases. A key of the head that is not one of mmseg's
    raises a KeyError.
    """
    if any(k.startswith(prefix) for k in state):
        state = {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
    converted = {}
    for key, value in state.items():
        for pattern, target in _MMSEG_KEYS:
            if re.match(pattern, key):
                converted[re.sub(pattern, target, key)] = value
                break
        else:
            raise KeyError(
                f"mmseg_state_dict: {key!r} is not a key of mmseg's LightHamHead; pass the "
                "head's state dict (or a segmentor's with the right prefix)."
            )
    return converted


def _int_list(owner: str, name: str, values: object, minimum: int | None) -> list[int]:
    if not isinstance(values, Sequence | range) or isinstance(values, str):
        raise TypeError(f"{owner}: {name} must be a list of integers, got {values!r}")
    out = list(values)
    for v in out:
        if isinstance(v, bool) or not isinstance(v, int) or (minimum is not None and v < minimum):
            bound = "" if minimum is None else f" >= {minimum}"
            raise ValueError(f"{owner}: {name} must be a list of integers{bound}, got {values!r}")
    return out
