"""An independent re-implementation of the official Hamburger block (V1 / V2, NMF / VQ / CD),
written from the method's equations and the official code's documented behaviour, as a float64
reference for the library's ``Hamburger``.

It shares no code with ``implicit_ham``: plain ``bmm`` loops, ``F.normalize`` with the official
eps values, an explicit inverse for CD's ridge regression, ``F.conv2d`` / ``F.batch_norm`` with
weights copied from the module under test. The official facts it encodes:

* lower bread: 1x1 conv with bias, followed by a ReLU only for NMF;
* fresh bases per forward (``torch.rand`` for NMF, ``torch.randn`` for VQ / CD, shape
  (B*S, d, r)), L2-normalised over d with ``F.normalize``'s default eps (1e-12);
* ``C0 = softmax_r(inv_t X^T D0)``; K steps under ``no_grad``; then the final coefficients with
  gradient and the output ``D_K C^T`` with D_K detached (the paper's one-step gradient);
* VQ / CD steps normalise X with ``F.normalize`` (eps 1e-12), the bases with eps 1e-6, and the
  coefficients over n with ``+ 1e-6``; NMF's multiplicative updates add 1e-6 to denominators;
* V1: upper bread conv (no bias) + BN; V2: cheese conv + BN + ReLU, upper conv without BN;
  ``out = ReLU(z + upper)``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

EPS = 1e-6


def _nmf_coef(x: Tensor, bases: Tensor, coef: Tensor) -> Tensor:
    numerator = torch.bmm(x.transpose(1, 2), bases)
    denominator = coef.bmm(bases.transpose(1, 2).bmm(bases))
    return coef * numerator / (denominator + EPS)


def _step(kind: str, x: Tensor, bases: Tensor, coef: Tensor, inv_t: float) -> tuple[Tensor, Tensor]:
    if kind == "nmf":
        coef = _nmf_coef(x, bases, coef)
        numerator = torch.bmm(x, coef)
        denominator = bases.bmm(coef.transpose(1, 2).bmm(coef))
        return bases * numerator / (denominator + EPS), coef
    unit_x = F.normalize(x, dim=1)
    if kind == "vq":
        similarity = torch.bmm(unit_x.transpose(1, 2), F.normalize(bases, dim=1, eps=EPS))
    else:
        similarity = torch.bmm(unit_x.transpose(1, 2), bases)
    coef = F.softmax(inv_t * similarity, dim=-1)
    coef = coef / (EPS + coef.sum(dim=1, keepdim=True))
    bases = torch.bmm(x, coef)
    if kind == "cd":
        bases = F.normalize(bases, dim=1, eps=EPS)
    return bases, coef


def _final_coef(
    kind: str, x: Tensor, bases: Tensor, coef: Tensor, inv_t: float, beta: float
) -> Tensor:
    if kind == "nmf":
        return _nmf_coef(x, bases, coef)
    if kind == "vq":
        with torch.no_grad():
            norms = x.norm(dim=1, keepdim=True)
        unit_x = x / (EPS + norms)
        similarity = torch.bmm(unit_x.transpose(1, 2), F.normalize(bases, dim=1, eps=EPS))
        return F.softmax(inv_t * similarity, dim=-1)
    rank = bases.shape[-1]
    eye = torch.eye(rank, dtype=x.dtype, device=x.device).repeat(x.shape[0], 1, 1)
    inverse = torch.inverse(torch.bmm(bases.transpose(1, 2), bases) + beta * eye)
    return x.transpose(1, 2).bmm(bases).bmm(inverse)


def official_ham(
    kind: str,
    x: Tensor,
    *,
    rank: int,
    steps: int,
    inv_t: float,
    beta: float = 0.1,
    groups: int = 1,
) -> Tensor:
    """The official ham on x (B, C, H, W): fresh bases from the global RNG (draw order and shape
    as the official code), K steps without gradient, the one-step readout."""
    batch, channels, height, width = x.shape
    d, n = channels // groups, height * width
    flat = x.reshape(batch * groups, d, n)
    draw = torch.rand if kind == "nmf" else torch.randn
    bases = F.normalize(draw((batch * groups, d, rank), dtype=x.dtype), dim=1)
    with torch.no_grad():
        coef = F.softmax(inv_t * torch.bmm(flat.transpose(1, 2), bases), dim=-1)
        for _ in range(steps):
            bases, coef = _step(kind, flat, bases, coef, inv_t)
    coef = _final_coef(kind, flat, bases, coef, inv_t, beta)
    return torch.bmm(bases, coef.transpose(1, 2)).reshape(batch, channels, height, width)


def _bn(x: Tensor, bn: torch.nn.BatchNorm2d, training: bool) -> Tensor:
    return F.batch_norm(
        x,
        bn.running_mean.clone(),
        bn.running_var.clone(),
        bn.weight,
        bn.bias,
        training=training,
        momentum=0.0,
        eps=bn.eps,
    )


def official_block(block: torch.nn.Module, kind: str, z: Tensor, *, inv_t: float) -> Tensor:
    """The official HamburgerV1 / V2 forward on z (B, C, H, W), with the weights of the library
    block ``block`` (read, never called) and its ham's settings."""
    training = block.training
    ham = block.ham
    lower = block.lower_bread[0]
    h = F.conv2d(z, lower.weight, lower.bias)
    if kind == "nmf":
        h = F.relu(h)
    h = official_ham(
        kind,
        h,
        rank=ham.rank,
        steps=ham.steps if training else ham.eval_steps,
        inv_t=inv_t,
        beta=getattr(ham, "beta", 0.1),
        groups=ham.groups,
    )
    if block.version == "v1":
        conv, bn = block.upper_bread[0], block.upper_bread[1]
        h = _bn(F.conv2d(h, conv.weight), bn, training)
    else:
        conv, bn = block.cheese[0], block.cheese[1]
        h = F.relu(_bn(F.conv2d(h, conv.weight), bn, training))
        h = F.conv2d(h, block.upper_bread.weight)
    return F.relu(h + z)
