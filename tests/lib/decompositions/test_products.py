"""The column-blocked ``D^T X`` of NMF's coefficient update (``decompositions.products``): a
product autograd can record is one ``bmm``; every blocked path (``out=``, ``cat`` under
forward-mode AD and torch.func) gives bitwise one value, equal to the single ``bmm`` up to
rounding, with the single product's derivatives; NMF's training forward is bitwise the same
under every backward mode and its inference forward matches the unblocked one. Blocking is
forced on small float64 shapes by lowering ``BLOCK_BYTES``."""

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
    bases = torch.rand(2, D, R, generator=gen, dtype=DT)
    return bases, torch.rand(2, D, N, generator=gen, dtype=DT)


def no_blocks(*_: object) -> bool:
    raise AssertionError("a product that autograd can record was blocked")


def test_block_choice_depends_on_device_shape_and_dtype_only(blocks_of_8) -> None:
    _, x = operands()
    assert column_block(x) == 8
    assert column_block(x.float()) is None  # half the bytes per column: blocks of 16, too few
    assert column_block(torch.rand(2, D, 64)) == 16
    assert column_block(x[..., :31]) is None  # fewer than MIN_BLOCKS blocks: one bmm
    assert column_block(torch.empty(2, D, N, dtype=DT, device="meta")) is None  # off the CPU


def test_a_product_autograd_can_record_is_one_bmm(blocks_of_8, monkeypatch) -> None:
    bases, x = operands()
    monkeypatch.setattr(products, "_writes_in_place", no_blocks)
    for needs_grad in ((True, False), (False, True)):
        b, xx = (t.clone().requires_grad_(g) for t, g in zip((bases, x), needs_grad, strict=True))
        assert torch.equal(bases_t_x(b, xx).detach(), torch.bmm(bases.mT, x))
        torch.func.grad(lambda t: bases_t_x(bases, t).sum())(x)  # tracked by torch.func.grad


def test_every_blocked_path_gives_one_value_close_to_one_bmm(blocks_of_8) -> None:
    bases, x = operands()
    with torch.no_grad():
        assert _writes_in_place(bases, x)
        in_place = bases_t_x(bases, x)
    primal, _ = torch.func.jvp(lambda t: bases_t_x(bases, t), (x,), (torch.ones_like(x),))
    batched = torch.func.vmap(bases_t_x)(bases.expand(3, -1, -1, -1), x.expand(3, -1, -1, -1))
    with forward_ad.dual_level():
        dual = forward_ad.make_dual(x, torch.ones_like(x))
        with torch.no_grad():
            assert not _writes_in_place(bases, dual)
            dual_value = forward_ad.unpack_dual(bases_t_x(bases, dual)).primal
    for got in (primal, *batched, dual_value):
        assert torch.equal(got, in_place)
    torch.testing.assert_close(in_place, torch.bmm(bases.mT, x), rtol=1e-14, atol=1e-14)


def test_float32_blocks_of_a_wide_x_match_one_bmm(monkeypatch: pytest.MonkeyPatch) -> None:
    """At the default dtype and a batch of 4: 2048 columns of d = 64 in blocks of 256 (the
    product's shape class at the paper's sizes, scaled down), against float64 and one bmm."""
    monkeypatch.setattr(products, "BLOCK_BYTES", 256 * 64 * 4)
    gen = torch.Generator().manual_seed(3)
    bases, x = torch.rand(4, 64, 16, generator=gen), torch.rand(4, 64, 2048, generator=gen)
    assert column_block(x) == 256
    with torch.no_grad():
        blocked = bases_t_x(bases, x)
    exact = torch.bmm(bases.double().mT, x.double())
    torch.testing.assert_close(blocked.double(), exact, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(blocked, torch.bmm(bases.mT, x), rtol=1e-6, atol=1e-6)


def test_blocked_derivatives_are_those_of_the_plain_product(blocks_of_8) -> None:
    bases, x = operands(seed=1)
    tangent = torch.rand_like(x)
    _, jvp = torch.func.jvp(lambda t: bases_t_x(bases, t), (x,), (tangent,))
    torch.testing.assert_close(jvp, torch.bmm(bases.mT, tangent), rtol=1e-14, atol=0)
    jac = torch.func.jacfwd(lambda t: bases_t_x(bases[:1], t))(x[:1])
    expected = torch.func.jacfwd(lambda t: torch.bmm(bases[:1].mT, t))(x[:1])
    torch.testing.assert_close(jac, expected, rtol=1e-14, atol=0)


ADJOINTS = {
    "unroll": ih.Unroll(),
    "one_step": ih.OneStep(),
    "truncated2": ih.Truncated(2),
    "phantom": ih.Phantom(k=2, tau=0.5),
    "implicit": ih.Implicit(linear_solver="gmres", max_steps=30),
}


def nmf_inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(2)
    x = torch.rand(2, D, N, 1, generator=gen, dtype=DT) + 0.1
    d0 = torch.rand(2, D, R, generator=gen, dtype=DT)
    weight = torch.randn(x.shape, generator=gen, dtype=DT)
    return x, d0 / d0.norm(dim=1, keepdim=True), weight


def test_nmf_training_forward_is_the_same_under_every_backward_mode(blocks_of_8, monkeypatch):
    monkeypatch.setattr(products, "_writes_in_place", no_blocks)  # X requires grad: no blocks
    x, d0, weight = nmf_inputs()
    values = {}
    for name, adjoint in ADJOINTS.items():
        layer = ih.make_decomposition("nmf", rank=R, steps=4, adjoint=adjoint)
        xg = x.clone().requires_grad_()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ih.ConvergenceWarning)
            y = layer(xg, init=d0)
            (y * weight).sum().backward()
        values[name] = y.detach()
    for name, value in values.items():
        assert torch.equal(value, values["unroll"]), name


def test_nmf_inference_forward_with_blocks_matches_the_single_products(monkeypatch) -> None:
    x, d0, _ = nmf_inputs()
    layer = ih.make_decomposition("nmf", rank=R, steps=4).eval()
    with torch.no_grad():
        single = layer(x, init=d0)
        monkeypatch.setattr(products, "BLOCK_BYTES", 8 * D * 8)
        calls = []
        monkeypatch.setattr(products, "column_block", lambda t: calls.append(1) or 8)
        blocked = layer(x, init=d0)
    assert calls  # the blocked path ran
    torch.testing.assert_close(blocked, single, rtol=1e-12, atol=1e-13)
