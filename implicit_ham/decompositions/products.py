"""``D^T X``, the product every NMF coefficient update starts from, in column blocks on the CPU;
and the NMF readout in column blocks (``readout_in_blocks``).

For a wide X (B, d, n) whose columns do not fit the last-level cache, one ``bmm`` of
(r, d) x (d, n) streams X once through a kernel blocked for the whole n; taking it in blocks of
columns of about ``BLOCK_BYTES`` each (``d * block * itemsize``) was 12-17 % faster per product
with MKL on one thread at the paper's sizes (d 512, r 64, n 128^2: 16.0 vs 18.5 ms, interleaved
medians on a 32 MiB-L3 AMD EPYC) and neither faster nor slower at n = 64^2.

Only a product that autograd cannot record is blocked: neither operand requires grad (an
inference forward, ``eval`` under ``no_grad``). A training forward (X requires grad) takes one
``bmm`` for every product, in every backward mode, so its value never depends on the mode, and
its backward keeps one (d, n) gradient instead of one per block joined by ``cat`` (which took
~40 MiB more peak memory at 128^2). Under torch.func transforms and forward-mode AD the blocks
are joined with ``cat``, elsewhere written into one result (``out=``): the same ``bmm`` calls on
the same operands either way (the tests check that every path equals the single ``bmm``). Off
the CPU, or for an X of fewer than ``MIN_BLOCKS`` blocks, it is one ``bmm``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor
from torch.autograd import forward_ad

from implicit_ham._core.transforms import active_transforms
from implicit_ham.decompositions.fused import may_overwrite

BLOCK_BYTES = 4 * 2**20
MIN_BLOCKS = 4
READOUT_BLOCK_BYTES = 128 * 2**10


def column_block(x: Tensor) -> int | None:
    """Columns per block of ``bases_t_x`` for X (B, d, n); None: one ``bmm``."""
    if x.device.type != "cpu" or x.dim() != 3:
        return None
    block = max(BLOCK_BYTES // max(x.shape[1] * x.element_size(), 1), 1)
    return block if x.shape[2] >= MIN_BLOCKS * block else None


def _writes_in_place(bases: Tensor, x: Tensor) -> bool:
    """Whether the blocks may be written into one preallocated result (``out=``): nothing
    records the product (``may_overwrite``), no torch.func transform wraps it and neither
    operand carries a forward-mode tangent (``out=`` accepts neither)."""
    if not may_overwrite(bases, x) or active_transforms():
        return False
    return all(forward_ad.unpack_dual(t).tangent is None for t in (bases, x))


def bases_t_x(bases: Tensor, x: Tensor) -> Tensor:
    """``D^T X`` (B, r, n) for D (B, d, r) and X (B, d, n), column-blocked where that is faster
    (``column_block``) and no operand requires grad; differentiable on every path (forward
    mode and torch.func included)."""
    block = column_block(x)
    if block is None or x.requires_grad or bases.requires_grad:
        return torch.bmm(bases.mT, x)
    pieces = x.split(block, dim=-1)
    if not _writes_in_place(bases, x):
        return torch.cat([torch.bmm(bases.mT, piece) for piece in pieces], dim=-1)
    out = x.new_empty((x.shape[0], bases.shape[2], x.shape[2]))
    for start, piece in zip(range(0, x.shape[2], block), pieces, strict=True):
        torch.bmm(bases.mT, piece, out=out[..., start : start + piece.shape[2]])
    return out


def readout_in_blocks(
    x: Tensor, bases: Tensor, coef: Tensor, update: Callable[[Tensor, Tensor, Tensor], Tensor]
) -> Tensor | None:
    """NMF's readout ``D C'^T`` (B, d, n), ``C'`` one more coefficient update of C, taken in
    blocks of columns of n: each block's columns of ``C'`` are formed and multiplied out at
    once, so the whole n x r ``C'`` never exists beside the state's ``C`` (which the layer keeps
    in ``last_solution``). The peak memory of an inference forward is then the official
    code's, which frees C as C' forms (at 128^2 it was one n x r, 4 MiB, above it). The update
    is the layer's own, per block: equal up to rounding to one update and one ``bmm`` (the BLAS
    may block a product differently for fewer columns; bitwise the same at the paper's sizes
    with MKL), as the blocked ``bases_t_x`` of the inference forward is. A forward that
    autograd records (training, in every backward mode) never takes this path.

    Args:
        x: X (B, d, n). bases: D (B, d, r). coef: C (B, n, r), any layout.
        update: ``(X columns (B, d, block), C rows (B, block, r), D^T D (B, r, r)) -> C'``
            rows (B, block, r) (``NMF._update_coef``); D^T D is formed once for all blocks.

    Returns:
        The readout, or None where blocks do not apply: off the CPU, where something records
        the products (``_writes_in_place``), or for fewer than two blocks (one ``bmm`` then).
        Blocks hold about ``READOUT_BLOCK_BYTES`` of (r, block) temporaries.
    """
    if x.device.type != "cpu" or x.dim() != 3 or any(t.requires_grad for t in (x, bases, coef)):
        return None
    if not _writes_in_place(bases, x) or forward_ad.unpack_dual(coef).tangent is not None:
        return None
    block = max(READOUT_BLOCK_BYTES // max(bases.shape[2] * x.element_size(), 1), 1)
    if x.shape[2] < 2 * block:
        return None
    gram = torch.bmm(bases.mT, bases)
    out = x.new_empty(x.shape)
    for start in range(0, x.shape[2], block):
        cols = slice(start, start + block)
        new = update(x[..., cols], coef[:, cols], gram)
        torch.bmm(bases, new.mT, out=out[..., cols])
        del new  # released before the next block's temporaries are allocated
    return out
