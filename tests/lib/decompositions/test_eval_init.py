"""``eval_init``: where a decomposition's initial bases come from in evaluation mode ("random",
"online", "fixed"), independently of ``init`` (training mode); "fixed" bases come from a
seeded generator, live in the state dict, and make evaluation bitwise reproducible."""

from __future__ import annotations

import io

import pytest
import torch
import torch.nn.functional as F

import implicit_ham as ih

KINDS = ["nmf", "vq", "cd", "svd", "nmf_ridge", "cd_ridge", "nmf_normalized"]


def _input(kind: str) -> torch.Tensor:
    x = torch.randn(2, 8, 5, 6, generator=torch.Generator().manual_seed(0))
    return x.abs() if ih.plugins.DECOMPOSITIONS.get(kind).nonnegative else x


@pytest.mark.parametrize("kind", KINDS)
def test_fixed_evaluation_is_bitwise_reproducible_whatever_the_global_rng(kind: str) -> None:
    layer = ih.make_decomposition(kind, rank=3, groups=2, channels=8, eval_init="fixed").eval()
    x = _input(kind)
    torch.manual_seed(0)
    first = layer(x)
    torch.manual_seed(1)
    torch.rand(10)  # the global stream moved on
    assert torch.equal(layer(x), first)
    random = ih.make_decomposition(kind, rank=3, groups=2, channels=8).eval()
    torch.manual_seed(0)
    a = random(x)
    torch.manual_seed(1)
    assert not torch.equal(random(x), a)  # the paper's random init: it varies


def test_fixed_bases_are_the_seeded_draw_and_leave_the_global_rng_alone() -> None:
    torch.manual_seed(5)
    state = torch.get_rng_state()
    nmf = ih.NMF(rank=3, groups=2, channels=8, eval_init="fixed", init_seed=7)
    assert torch.equal(torch.get_rng_state(), state)
    g = torch.Generator().manual_seed(7)
    expected = F.normalize(torch.rand(2, 4, 3, generator=g), dim=1)  # NMF: uniform bases
    assert torch.equal(nmf.fixed_bases, expected)
    assert "fixed_bases" in nmf.state_dict()
    vq = ih.VQ(rank=3, groups=2, channels=8, init="fixed", init_seed=7)
    g = torch.Generator().manual_seed(7)
    assert torch.equal(vq.fixed_bases, F.normalize(torch.randn(2, 4, 3, generator=g), dim=1))
    flat = nmf.eval().flatten(torch.rand(3, 8, 4, 4))
    assert torch.equal(nmf.initial_bases(flat), expected.repeat(3, 1, 1))  # shared by the batch


def test_fixed_bases_survive_save_and_load_into_a_differently_seeded_layer() -> None:
    layer = ih.CD(rank=3, channels=8, eval_init="fixed", init_seed=1).eval()
    x = _input("cd")
    out = layer(x)
    buffer = io.BytesIO()
    torch.save(layer.state_dict(), buffer)
    buffer.seek(0)
    other = ih.CD(rank=3, channels=8, eval_init="fixed", init_seed=2).eval()
    assert not torch.equal(other(x), out)
    other.load_state_dict(torch.load(buffer))
    assert torch.equal(other(x), out)


def test_training_keeps_random_bases_unless_asked() -> None:
    layer = ih.NMF(rank=3, channels=8, eval_init="fixed")
    x = _input("nmf")
    torch.manual_seed(0)
    a = layer(x)
    assert not torch.equal(layer(x), a)  # training mode: init="random"
    asked = ih.NMF(rank=3, channels=8, init="fixed")
    assert torch.equal(asked(x), asked(x)) and asked.eval_init_mode == "fixed"
    assert torch.equal(asked.eval()(x), layer.eval()(x))  # one seed, one set of bases


def test_fixed_without_a_known_d_draws_from_the_seed_at_each_forward() -> None:
    channel_ham = ih.VQ(rank=2, spatial=False, eval_init="fixed").eval()
    assert not hasattr(channel_ham, "fixed_bases")
    x = torch.randn(2, 6, 4, 4)
    torch.manual_seed(0)
    first = channel_ham(x)
    torch.manual_seed(1)
    assert torch.equal(channel_ham(x), first)
    g = torch.Generator().manual_seed(0)
    bases = F.normalize(torch.randn(1, 16, 2, generator=g), dim=1).repeat(2, 1, 1)
    assert torch.equal(first, channel_ham(x, init=bases))


def test_online_evaluation_uses_the_running_bases_trained_with_random_init() -> None:
    vq = ih.VQ(rank=3, channels=8, eval_init="online", online_update="train", inv_t=5.0)
    x = _input("vq")
    start = vq.bases.clone()
    vq(x)  # training: random initial bases, and the running bases move towards D_K
    final = vq.last_solution.value[0].reshape(2, 1, 8, 3).mean(dim=0)
    moved = start + 0.9 * (final - start)
    assert torch.allclose(vq.bases, F.normalize(moved, dim=1), atol=1e-6)
    vq.eval()
    frozen = vq.bases.clone()
    out = vq(x)
    assert torch.equal(vq.bases, frozen)  # "train" policy: evaluation leaves them
    assert torch.equal(out, vq(x, init=frozen.repeat(2, 1, 1)))


def test_repr_shows_an_eval_init_that_differs() -> None:
    assert "eval_init='fixed'" in repr(ih.NMF(eval_init="fixed", channels=8))
    assert "eval_init" not in repr(ih.NMF())


def test_bad_eval_init_and_seed_are_refused() -> None:
    with pytest.raises(ValueError, match="eval_init must be one of random, online, fixed"):
        ih.NMF(eval_init="frozen")
    with pytest.raises(ValueError, match="init_seed must be an integer >= 0"):
        ih.NMF(eval_init="fixed", init_seed=-1)
    with pytest.raises(ValueError, match="needs channels=C and spatial=True"):
        ih.NMF(eval_init="online")
    layer = ih.NMF(rank=2, channels=8, eval_init="fixed").eval()
    with pytest.raises(ValueError, match="fixed bases have d=8"):
        ih.NMF(rank=2, channels=8, eval_init="fixed").eval().initial_bases(torch.rand(1, 6, 9))
    assert layer(torch.rand(1, 8, 3, 3)).shape == (1, 8, 3, 3)


def test_a_checkpoint_without_fixed_bases_loads_strictly_and_keeps_the_seeded_ones() -> None:
    old = ih.Hamburger(8, ih.NMF(rank=2, channels=8), "v1").state_dict()  # random-init model
    assert not any(k.endswith("fixed_bases") for k in old)
    block = ih.Hamburger(8, ih.NMF(rank=2, channels=8, eval_init="fixed", init_seed=3), "v1")
    seeded = block.ham.fixed_bases.clone()
    block.load_state_dict(old, strict=True)
    assert torch.equal(block.ham.fixed_bases, seeded)
    assert "ham.fixed_bases" not in old  # the caller's dict is left as it was
