"""An independent re-implementation of SegNeXt / mmseg's ``LightHamHead`` forward, written from
its published description (mmseg's ``ham_head.py``, mmcv's ``ConvModule``), as a float64
reference for ``implicit_ham.LightHamHead``. It shares no code with implicit_ham: functional
``F.conv2d`` / ``F.group_norm`` / ``bmm`` calls on a dict of tensors named as in mmseg.

The facts it encodes:

* the levels ``in_index`` are bilinearly resized to the first one's size and concatenated;
* ``squeeze`` and ``align``: 1x1 conv without bias -> GroupNorm -> ReLU;
* the Hamburger: ``ham_in`` 1x1 conv with bias, ReLU, NMF, ``ham_out`` 1x1 conv without bias
  -> GroupNorm, then ``ReLU(x + ham_out)``;
* NMF on (B, d, n) with S = 1: bases ``torch.rand((B, d, R))`` from the global RNG in the
  input's dtype, ``F.normalize`` over d; ``C = softmax(X^T D)`` (temperature 1); K steps of
  ``C <- C * (X^T D) / (C D^T D + 1e-6)`` then ``D <- D * (X C) / (D C^T C + 1e-6)``; one more
  C update; output ``D C^T``; the gradient runs through every step;
* dropout2d (in training, after the bases were drawn) and the classifier ``conv_seg`` (with
  bias).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

EPS = 1e-6


def _conv(x: Tensor, p: Mapping[str, Tensor], name: str) -> Tensor:
    return F.conv2d(x, p[f"{name}.weight"], p.get(f"{name}.bias"))


def _gn(x: Tensor, p: Mapping[str, Tensor], name: str, groups: int) -> Tensor:
    return F.group_norm(x, groups, p[f"{name}.weight"], p[f"{name}.bias"], eps=1e-5)


def _nmf(x: Tensor, rank: int, steps: int, bases: Tensor | None) -> Tensor:
    b, c, h, w = x.shape
    flat = x.reshape(b, c, h * w)
    if bases is None:
        bases = F.normalize(torch.rand((b, c, rank), dtype=x.dtype), dim=1)
    coef = F.softmax(torch.bmm(flat.transpose(1, 2), bases), dim=-1)
    for _ in range(steps):
        coef = (
            coef
            * torch.bmm(flat.transpose(1, 2), bases)
            / (coef.bmm(bases.transpose(1, 2).bmm(bases)) + EPS)
        )
        bases = bases * torch.bmm(flat, coef) / (bases.bmm(coef.transpose(1, 2).bmm(coef)) + EPS)
    coef = (
        coef
        * torch.bmm(flat.transpose(1, 2), bases)
        / (coef.bmm(bases.transpose(1, 2).bmm(bases)) + EPS)
    )
    return torch.bmm(bases, coef.transpose(1, 2)).reshape(b, c, h, w)


def light_ham_head(
    params: Mapping[str, Tensor],
    inputs: Sequence[Tensor],
    *,
    in_index: Sequence[int],
    rank: int,
    training: bool,
    dropout_ratio: float,
    align_corners: bool = False,
    groups: int = 32,
    bases: Tensor | None = None,
) -> Tensor:
    """The head's logits (B, classes, H_0, W_0). ``params`` uses mmseg's names (``squeeze.conv``,
    ``squeeze.gn``, ``hamburger.ham_in.conv``, ``hamburger.ham_out.conv``,
    ``hamburger.ham_out.gn``, ``align.conv``, ``align.gn``, ``conv_seg``); ``bases`` (B, d, R)
    replaces the random draw (None: drawn, as the head does)."""
    feats = [inputs[i] for i in in_index]
    size = feats[0].shape[2:]
    x = torch.cat(
        [F.interpolate(f, size=size, mode="bilinear", align_corners=align_corners) for f in feats],
        dim=1,
    )
    x = F.relu(_gn(_conv(x, params, "squeeze.conv"), params, "squeeze.gn", groups))
    enjoy = F.relu(_conv(x, params, "hamburger.ham_in.conv"))
    enjoy = _nmf(enjoy, rank, 6 if training else 7, bases)
    enjoy = _gn(
        _conv(enjoy, params, "hamburger.ham_out.conv"), params, "hamburger.ham_out.gn", groups
    )
    x = F.relu(x + enjoy)
    x = F.relu(_gn(_conv(x, params, "align.conv"), params, "align.gn", groups))
    x = F.dropout2d(x, dropout_ratio, training=training)
    return _conv(x, params, "conv_seg")
