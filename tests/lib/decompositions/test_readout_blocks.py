"""NMF's inference readout in column blocks (``products.readout_in_blocks``): the value of
``compute_coef`` followed by one ``bmm`` (to rounding; bitwise at a size where the BLAS blocks
the same way), equal to a float64 evaluation of the equations,
taken only where nothing records the products, and without an n x r coefficient tensor beside
the state's (the peak of an inference forward is the output, the state and two (r, block)
temporaries). Blocks are forced on small shapes by lowering ``READOUT_BLOCK_BYTES``."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from helpers.live_bytes import LiveStorageBytes
from torch.autograd import forward_ad

import implicit_ham as ih
from implicit_ham.decompositions import products
from implicit_ham.decompositions.products import readout_in_blocks

D, R, N, BLOCK = 16, 4, 100, 24  # 100 columns: four blocks of 24 and a ragged one of 4
EPS = 1e-6


@pytest.fixture
def blocks_of_24(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(products, "READOUT_BLOCK_BYTES", BLOCK * R * 4)  # float32 (r, 24)


def operands(dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(2, D, N, generator=gen, dtype=dtype)
    bases = torch.rand(2, D, R, generator=gen, dtype=dtype)
    coef = torch.rand(2, R, N, generator=gen, dtype=dtype).mT  # NMF's (r, n) layout
    return x, bases, coef


def update_of(
    bases: torch.Tensor,
) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
    """NMF's coefficient update of one block, as the layer hands it to ``readout_in_blocks``."""
    layer = ih.NMF(rank=R)
    assert layer.eps == EPS
    return lambda xs, cs, gram: layer._update_coef(xs, bases, cs, gram)


def unblocked(x: torch.Tensor, bases: torch.Tensor, coef: torch.Tensor) -> torch.Tensor:
    layer = ih.NMF(rank=R)
    return torch.bmm(bases, layer.compute_coef(x, (bases, coef)).mT)


def test_blocks_give_the_unblocked_value_and_the_equations_value(blocks_of_24) -> None:
    x, bases, coef = operands()
    with torch.no_grad():
        out = readout_in_blocks(x, bases, coef, update_of(bases))
        assert out is not None
        torch.testing.assert_close(out, unblocked(x, bases, coef), rtol=1e-6, atol=1e-7)
    x64, b64, c64 = (t.double() for t in (x, bases, coef))
    new = (
        c64
        * torch.einsum("bdn,bdr->bnr", x64, b64)
        / (torch.einsum("bnr,bdr,bds->bns", c64, b64, b64) + EPS)
    )
    reference = torch.einsum("bdr,bnr->bdn", b64, new)
    torch.testing.assert_close(out.double(), reference, rtol=1e-5, atol=1e-6)


def test_blocks_apply_only_where_nothing_records_the_products(blocks_of_24) -> None:
    x, bases, coef = operands()
    with torch.no_grad():
        assert (
            readout_in_blocks(
                x[..., : 2 * BLOCK - 1], bases, coef[:, : 2 * BLOCK - 1], update_of(bases)
            )
            is None
        )
        meta = [t.to("meta") for t in (x, bases, coef)]
        assert readout_in_blocks(*meta, update_of(meta[1])) is None  # off the CPU
    assert (
        readout_in_blocks(x.requires_grad_(), bases, coef, update_of(bases)) is None
    )  # autograd records
    x.requires_grad_(False)
    seen: list[object] = []
    torch.func.grad(lambda b: seen.append(readout_in_blocks(x, b, coef, update_of(b))) or b.sum())(
        bases
    )
    assert seen == [None]  # a torch.func transform
    with torch.no_grad(), forward_ad.dual_level():
        dual = forward_ad.make_dual(coef, torch.ones_like(coef))
        assert readout_in_blocks(x, bases, dual, update_of(bases)) is None  # a forward-mode tangent


def test_the_layer_uses_blocks_in_inference_only_and_its_value_does_not_change(
    blocks_of_24, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[bool] = []
    real = products.readout_in_blocks

    def spy(*args: object) -> object:
        out = real(*args)  # type: ignore[arg-type]
        calls.append(out is not None)
        return out

    monkeypatch.setattr(ih.decompositions.nmf, "readout_in_blocks", spy)
    x = torch.rand(2, D, 10, 10, generator=torch.Generator().manual_seed(1))
    layer = ih.NMF(rank=R, steps=4, eval_steps=4).eval()
    init = torch.rand(2, D, R, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        inference = layer(x, init)
    values = []
    for adjoint in ("one_step", "unroll", "implicit"):
        layer = ih.NMF(rank=R, steps=4, eval_steps=4, adjoint=adjoint)
        values.append(layer(x.clone().requires_grad_(), init).detach())
    assert all(torch.equal(v, values[0]) for v in values)  # the same in every backward mode
    torch.testing.assert_close(inference, values[0], rtol=1e-6, atol=1e-7)
    assert calls[0] and not any(calls[1:])
    # a subclass with its own coefficients keeps the plain readout
    assert type(ih.make_decomposition("nmf_ridge", rank=R)).compute_coef is not ih.NMF.compute_coef


def test_an_inference_forward_keeps_no_coefficient_array_beside_the_state(blocks_of_24) -> None:
    side = 10
    n = side * side
    x = torch.rand(1, D, side, side, generator=torch.Generator().manual_seed(0))
    layer = ih.NMF(rank=R, steps=6, eval_steps=6).eval()
    with torch.no_grad():
        layer(x)
        with LiveStorageBytes(ignore=(x,)) as live:
            layer(x)
    item = x.element_size()
    output, coef, bases, block = D * n * item, n * R * item, D * R * item, R * BLOCK * item
    small = sum(b for b, _, _ in live.at_peak if b < bases)  # (B,) stats, the r x r Gram
    # the output, C_K and D_K (last_solution), one block's numerator and denominator: no
    # C_{K+1} (the unblocked readout's peak is output + 2 coef + bases, test_memory)
    assert live.peak - small == output + coef + bases + 2 * block, live.at_peak
