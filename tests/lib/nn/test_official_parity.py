"""The Hamburger block matches an independent re-implementation of the official block
(``official_block``) in float64: outputs, input gradients and parameter gradients, for NMF, VQ
and CD, V1 and V2, in training and evaluation mode; and the official defaults (lower-bread
ReLU only for NMF, online bases updated only in evaluation mode) hold, with the departures as
explicit options."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers.official_block import official_block

import implicit_ham as ih

DT = torch.float64
INV_T = {"nmf": 1.0, "vq": 100.0, "cd": 100.0}
HAMS = {"nmf": ih.NMF, "vq": ih.VQ, "cd": ih.CD}


def make_block(kind: str, version: str, seed: int = 0) -> ih.Hamburger:
    torch.manual_seed(seed)
    ham = HAMS[kind](rank=3, steps=4, eval_steps=5)
    block = ih.Hamburger(channels=6, ham=ham, version=version, ham_channels=8).to(DT)
    with torch.no_grad():  # non-trivial BN statistics and affine parameters
        for m in block.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.2, 0.2)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.1, 0.1)
    return block


def run(fn, z: torch.Tensor, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """fn(z) and d(sum(out * w))/dz with a fixed weight w, from the RNG state ``seed``."""
    z = z.detach().clone().requires_grad_()
    torch.manual_seed(seed)
    out = fn(z)
    weight = torch.linspace(-1.0, 1.0, out.numel(), dtype=DT).reshape(out.shape)
    (grad,) = torch.autograd.grad((out * weight).sum(), z)
    return out, grad


@pytest.mark.parametrize("kind", ["nmf", "vq", "cd"])
@pytest.mark.parametrize("version", ["v1", "v2"])
@pytest.mark.parametrize("training", [True, False])
def test_block_matches_the_official_block(kind, version, training) -> None:
    block = make_block(kind, version)
    block.train(training)
    z = torch.randn(2, 6, 5, 4, dtype=DT, generator=torch.Generator().manual_seed(1)).relu()

    ours, grad_ours = run(block, z, seed=7)
    ref, grad_ref = run(lambda t: official_block(block, kind, t, inv_t=INV_T[kind]), z, seed=7)

    torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(grad_ours, grad_ref, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("kind", ["nmf", "vq", "cd"])
def test_parameter_gradients_match_the_official_block(kind) -> None:
    block = make_block(kind, "v2")
    z = torch.randn(2, 6, 5, 4, dtype=DT, generator=torch.Generator().manual_seed(2))
    params = [p for p in block.parameters() if p.requires_grad]

    torch.manual_seed(3)
    ours = torch.autograd.grad(block(z).square().sum(), params)
    torch.manual_seed(3)
    ref = torch.autograd.grad(
        official_block(block, kind, z, inv_t=INV_T[kind]).square().sum(), params
    )
    for a, b in zip(ours, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10)


def test_lower_bread_relu_follows_the_official_code_and_can_be_forced() -> None:
    for kind, expected in (("nmf", True), ("vq", False), ("cd", False)):
        block = ih.Hamburger(8, HAMS[kind](rank=2))
        has_relu = any(isinstance(m, torch.nn.ReLU) for m in block.lower_bread)
        assert has_relu is expected and block.lower_relu is expected, kind
    forced = ih.Hamburger(8, ih.VQ(rank=2), lower_relu=True)
    assert any(isinstance(m, torch.nn.ReLU) for m in forced.lower_bread)
    x = -torch.ones(1, 8, 3, 3)
    assert float(forced.lower_bread(x).detach().amin()) >= 0.0


def online_ham(update: str) -> ih.NMF:
    torch.manual_seed(0)
    return ih.NMF(rank=2, steps=3, eval_steps=3, init="online", channels=6, online_update=update)


@pytest.mark.parametrize(
    ("update", "changes_in_train", "changes_in_eval"),
    [("eval", False, True), ("train", True, False), ("always", True, True)],
)
def test_online_bases_update_when_the_option_says(update, changes_in_train, changes_in_eval):
    x = torch.rand(2, 6, 4, 4)
    for training, expected in ((True, changes_in_train), (False, changes_in_eval)):
        ham = online_ham(update).train(training)
        before = ham.bases.clone()
        ham(x)
        assert (not torch.equal(before, ham.bases)) is expected, (update, training)


def test_the_default_online_update_is_the_official_formula_in_eval_mode() -> None:
    ham = online_ham("eval").eval()
    x = torch.rand(2, 6, 4, 4)
    before = ham.bases.clone()
    ham(x)
    bases = ham.last_solution.value[0]  # (B*S, d, r): the bases after the K steps
    moved = before + 0.9 * (bases.mean(dim=0, keepdim=True) - before)
    torch.testing.assert_close(ham.bases, F.normalize(moved, dim=1), rtol=1e-6, atol=1e-7)


def test_vq_normalises_tiny_columns_like_f_normalize() -> None:
    """A pixel column with norm 1e-8 (between the official 1e-12 and the iteration's 1e-6) is
    normalised to unit length, as F.normalize does; norm_eps makes the old clamp an option."""
    x = torch.randn(1, 4, 3, 3, dtype=DT)
    x[0, :, 0, 0] *= 1e-8 / x[0, :, 0, 0].norm()
    flat = x.reshape(1, 4, 9)
    default = ih.VQ(rank=2).loop_invariants(flat)
    clamped = ih.VQ(rank=2, norm_eps=1e-6).loop_invariants(flat)
    assert float(default[0, 0, 0]) == pytest.approx(100.0 / 1e-8, rel=1e-9)
    assert float(clamped[0, 0, 0]) == pytest.approx(100.0 / 1e-6, rel=1e-9)
