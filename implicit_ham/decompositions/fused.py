"""Allocation-light building blocks shared by the decompositions' iterations.

When autograd does not need a temporary (no-grad mode, e.g. the K iterations of the paper's
one-step gradient, or no operand that requires grad) and no ``torch.compile`` trace is active
(inductor fuses elementwise work itself), the helpers write into the temporaries their caller
has just produced instead of allocating new ones. The value is bitwise the same either way:
the same operations run in the same order. The iterate passed in is never modified (the solver
still compares it with the new one).
"""

from __future__ import annotations

import torch
from torch import Tensor


def may_overwrite(*tensors: Tensor) -> bool:
    """Whether temporaries computed from ``tensors`` can be updated in place: gradient
    recording is off or none of them requires grad, and no ``torch.compile`` trace is active."""
    if torch.compiler.is_compiling():
        return False
    return not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors))


def multiplicative_update(value: Tensor, numer: Tensor, denom: Tensor, eps: float) -> Tensor:
    """``value * numer / (denom + eps)``, evaluated as ``(numer * value) / (denom + eps)`` (the
    official code's order).

    All three have one shape (e.g. C (B, n, r) or D (B, d, r)). ``numer`` and ``denom`` must be
    temporaries owned by the caller: when ``may_overwrite`` allows it, ``denom`` is overwritten
    and the result is returned in ``numer``'s memory, with no allocation at all (three in-place
    passes: at 128^2 a fresh n x r quotient per update cost ~5 % of the NMF forward); no
    ``out=``, which forward-mode AD such as ``torch.func.jvp`` rejects. ``value`` is never
    modified (the solver still compares it with the new iterate).
    """
    if not may_overwrite(value, numer, denom):
        return numer * value / (denom + eps)
    return numer.mul_(value).div_(denom.add_(eps))


def normalize_over_n(coef: Tensor, eps: float) -> Tensor:
    """``C / (sum_n C + eps)`` for C (B, n, r): each basis' column of weights sums to ~1.
    ``coef`` must be a caller-owned temporary (it may be overwritten, see the module doc)."""
    mass = coef.sum(dim=1, keepdim=True)
    if not may_overwrite(coef):
        return coef / (mass + eps)
    return coef.div_(mass.add_(eps))


def normalized_similarity(x: Tensor, bases: Tensor, scale: Tensor) -> Tensor:
    """``(X^T D) * scale`` (B, n, r) for X (B, d, n), D (B, d, r) and a per-pixel ``scale``
    (B, n, 1); with ``scale = inv_t / max(||x_j||, eps)`` it is ``inv_t normalize_d(X)^T D``
    without materialising the normalised copy of X (B, d, n) at every iteration."""
    similarity = torch.bmm(x.mT, bases)
    if not may_overwrite(x, bases, scale):
        return similarity * scale
    return similarity.mul_(scale)


_HALF = (torch.float16, torch.bfloat16)


def similarity_softmax(x: Tensor, bases: Tensor, scale: Tensor) -> Tensor:
    """``softmax_r((X^T D) * scale)`` (B, n, r) for X (B, d, n), D (B, d, r), scale (B, n, 1).

    With ``scale`` of order ``inv_t = 100`` the logits are ``100 x`` a cosine, so a half-precision
    product (bfloat16 keeps 8 bits: an error of ~0.4 in the logits) reshuffles the assignments.
    For float16 / bfloat16 inputs, or under ``torch.autocast``, the product, the scaling and the
    softmax therefore run in float32 (autocast off) and the result is cast back to X's dtype;
    float32 and float64 inputs take the plain path, unchanged.
    """
    autocast = torch.is_autocast_enabled(x.device.type)
    if x.dtype not in _HALF and not autocast:
        return torch.softmax(normalized_similarity(x, bases, scale), dim=-1)
    with torch.autocast(x.device.type, enabled=False):
        logits = torch.bmm(x.float().mT, bases.float()) * scale.float()
        return torch.softmax(logits, dim=-1).to(x.dtype)


def column_norms(x: Tensor) -> Tensor:
    """``||x_j||`` over d for X (B, d, n), shaped (B, n, 1) to scale the rows of ``X^T D``."""
    return torch.linalg.vector_norm(x, dim=1).unsqueeze(-1)
