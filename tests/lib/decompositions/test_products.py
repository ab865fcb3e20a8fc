"""The column-blocked ``D^T X`` of NMF's coefficient update (``decompositions.products``): every
path gives bitwise one value, equal to one ``bmm``; its gradients (autograd, forward mode,
torch.func) are those of the plain product; NMF's forward value stays bitwise the same under
every backward mode when the blocks are in use. Blocking is forced on small float64 shapes by
lowering ``BLOCK_BYTES``."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.autograd import forward_ad

import implicit_ham as ih
from implicit_ham.decompositions import products
from implicit_ham.decompositions.products import _writes_in_place, bases_t_x, column_block

DT = torch.float64
D, R, N = 6, 3, 43  # 43 columns: five blocks of 8 and a ragged one of 3


@pytest.fixture
def blocks_of_8(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(products, "BLOCK_BYTES", 8 * D * 8)  # 8 float64 columns of d = 6


def operands(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(2, D, R, generator=gen, dtype=DT), torch.rand(
        2, D, N, generator=gen, dtype=DT
    )


def test_block_choice_depends_on_device_shape_and_dtype_only(blocks_of_8) -> None:
    _, x = operands()
    assert column_block(x) == 8
    assert column_block(x.float()) is None  # half the bytes per column: blocks of 16, too few
    assert column_block(torch.rand(2, D, 64)) == 16
    assert column_block(x[..., :31]) is None  # fewer than MIN_BLOCKS blocks: one bmm
    assert column_block(torch.empty(2, D, N, dtype=DT, device="meta")) is None  # off the CPU
    with torch.no_grad():
        assert column_block(x) == 8


def test_every_path_gives_the_one_bmm_value_bit_for_bit(blocks_of_8) -> None:
    bases, x = operands()
    expected = torch.bmm(bases.mT, x)
    with torch.no_grad():
        assert _writes_in_place(bases, x)
        in_place = bases_t_x(bases, x)
    xg = x.clone().requires_grad_()
    assert not _writes_in_place(bases, xg)
    recorded = bases_t_x(bases, xg)
    primal, _ = torch.func.jvp(lambda t: bases_t_x(bases, t), (x,), (torch.ones_like(x),))
    batched = torch.func.vmap(bases_t_x)(bases.expand(3, -1, -1, -1), x.expand(3, -1, -1, -1))
    with forward_ad.dual_level():
        dual = forward_ad.make_dual(x, torch.ones_like(x))
        with torch.no_grad():
            assert not _writes_in_place(bases, dual)
            dual_value = forward_ad.unpack_dual(bases_t_x(bases, dual)).primal
    for got in (in_place, recorded.detach(), primal, *batched, dual_value):
        assert torch.equal(got, in_place)
    torch.testing.assert_close(in_place, expected, rtol=1e-14, atol=1e-14)


def test_gradients_are_those_of_the_plain_product(blocks_of_8) -> None:
    bases, x = operands(seed=1)
    bases.requires_grad_()
    x.requires_grad_()
    assert torch.autograd.gradcheck(bases_t_x, (bases, x))
    assert torch.autograd.gradgradcheck(bases_t_x, (bases, x))
    tangent = torch.rand_like(x)
    _, jvp = torch.func.jvp(lambda t: bases_t_x(bases.detach(), t), (x.detach(),), (tangent,))
    torch.testing.assert_close(jvp, torch.bmm(bases.detach().mT, tangent), rtol=1e-14, atol=0)


ADJOINTS = {
    "unroll": ih.Unroll(),
    "one_step": ih.OneStep(),
    "truncated2": ih.Truncated(2),
    "phantom": ih.Phantom(k=2, tau=0.5),
    "implicit": ih.Implicit(linear_solver="gmres", max_steps=30),
}


def nmf_run(adjoint: ih.plugins.Adjoint) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(2)
    x = (torch.rand(2, D, N, 1, generator=gen, dtype=DT) + 0.1).requires_grad_()
    d0 = torch.rand(2, D, R, generator=gen, dtype=DT)
    weight = torch.randn(x.shape, generator=gen, dtype=DT)
    layer = ih.make_decomposition("nmf", rank=R, steps=4, adjoint=adjoint)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ih.ConvergenceWarning)
        y = layer(x, init=d0 / d0.norm(dim=1, keepdim=True))
        (y * weight).sum().backward()
    assert x.grad is not None
    return y.detach(), x.grad


def test_nmf_forward_value_is_the_same_under_every_backward_mode_with_blocks(
    blocks_of_8, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = {name: nmf_run(adjoint) for name, adjoint in ADJOINTS.items()}
    for name, (value, _) in runs.items():
        assert torch.equal(value, runs["unroll"][0]), name
    monkeypatch.setattr(products, "BLOCK_BYTES", 2**40)  # one bmm everywhere
    for name in ("unroll", "one_step"):
        value, grad = nmf_run(ADJOINTS[name])
        torch.testing.assert_close(runs[name][0], value, rtol=1e-13, atol=1e-14)
        torch.testing.assert_close(runs[name][1], grad, rtol=1e-11, atol=1e-13)
