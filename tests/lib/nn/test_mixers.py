"""Token mixers (B, N, C) -> (B, N, C): the Hamburger mixer and its attention baselines against
references written from the equations, finite differences, torch's own multi-head attention,
the registry and the input checks."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import implicit_ham as ih
from implicit_ham.nn import decomposition_of, linear_attention


def _project(linear: nn.Linear, x: torch.Tensor, heads: int) -> torch.Tensor:
    """(B, N, C) -> per-head (B, heads, N, d_h), the projection written out."""
    y = torch.einsum("oc,bnc->bno", linear.weight, x) + linear.bias
    inner = y.shape[-1]
    return torch.stack(
        [y[..., h * inner // heads : (h + 1) * inner // heads] for h in range(heads)], 1
    )


def _merge(module, per_head: torch.Tensor) -> torch.Tensor:
    mixed = torch.cat(list(per_head.unbind(1)), dim=-1)  # (B, N, inner)
    return torch.einsum("oc,bnc->bno", module.out.weight, mixed) + module.out.bias


def reference_softmax(module, x: torch.Tensor) -> torch.Tensor:
    """W_o [softmax(Q K^T / sqrt(d_h)) V]_heads with an explicit softmax."""
    q, k, v = (_project(p, x, module.heads) for p in (module.query, module.key, module.value))
    scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    weights = torch.exp(scores - scores.amax(-1, keepdim=True))
    return _merge(module, (weights / weights.sum(-1, keepdim=True)) @ v)


def reference_linear(module, x: torch.Tensor, eps: float) -> torch.Tensor:
    """out_i = sum_j sim(q_i, k_j) v_j / (sum_j sim(q_i, k_j) + eps), sim = phi(q).phi(k),
    phi = elu + 1: the quadratic form of Katharopoulos et al.'s eq. (2)-(4), loop over i."""
    q, k, v = (_project(p, x, module.heads) for p in (module.query, module.key, module.value))
    phi = lambda t: torch.where(t > 0, t + 1, torch.exp(t))  # noqa: E731  elu(t) + 1
    rows = []
    for i in range(q.shape[2]):
        sim = (phi(q[:, :, i : i + 1]) * phi(k)).sum(-1)  # (B, heads, N)
        rows.append((sim.unsqueeze(-1) * v).sum(2) / (sim.sum(-1, keepdim=True) + eps))
    return _merge(module, torch.stack(rows, dim=2))


@pytest.mark.parametrize("heads", [1, 2])
def test_sdpa_mixer_is_softmax_attention(heads):
    torch.manual_seed(0)
    mixer = ih.SDPAMixer(8, inner_channels=6, heads=heads).double()
    x = torch.randn(2, 7, 8, dtype=torch.float64)
    torch.testing.assert_close(mixer(x), reference_softmax(mixer, x), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("heads", [1, 2])
def test_causal_sdpa_mixer_is_masked_softmax_attention(heads):
    """causal=True: softmax over j <= i only (an explicit lower-triangular mask in float64),
    so output token i does not move when a later token changes; bidirectional by default."""
    torch.manual_seed(2)
    mixer = ih.SDPAMixer(8, inner_channels=6, heads=heads, causal=True).double()
    x = torch.randn(2, 7, 8, dtype=torch.float64)
    q, k, v = (_project(p, x, heads) for p in (mixer.query, mixer.key, mixer.value))
    scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    future = torch.ones(7, 7, dtype=torch.bool).triu(1)
    weights = torch.exp(scores - scores.amax(-1, keepdim=True)).masked_fill(future, 0.0)
    expected = _merge(mixer, (weights / weights.sum(-1, keepdim=True)) @ v)
    torch.testing.assert_close(mixer(x), expected, rtol=1e-12, atol=1e-12)
    moved = x.clone()
    moved[:, -1] += 1.0
    torch.testing.assert_close(mixer(moved)[:, :-1], mixer(x)[:, :-1], rtol=0, atol=0)
    assert not ih.SDPAMixer(8).causal and "causal=True" in repr(mixer)
    assert ih.make_context("sdpa_mixer", 8, causal=True).causal
    with pytest.raises(TypeError, match="causal must be True or False"):
        ih.SDPAMixer(8, causal=1)  # type: ignore[arg-type]


def test_sdpa_mixer_equals_torch_multihead_attention_with_the_same_weights():
    """The mixer is a drop-in for ``nn.MultiheadAttention(batch_first=True)(x, x, x)[0]``."""
    torch.manual_seed(1)
    mha = nn.MultiheadAttention(8, 2, batch_first=True).double()
    mixer = ih.SDPAMixer(8, heads=2).double()
    wq, wk, wv = mha.in_proj_weight.detach().chunk(3)
    bq, bk, bv = mha.in_proj_bias.detach().chunk(3)
    with torch.no_grad():
        for linear, w, b in ((mixer.query, wq, bq), (mixer.key, wk, bk), (mixer.value, wv, bv)):
            linear.weight.copy_(w), linear.bias.copy_(b)
        mixer.out.weight.copy_(mha.out_proj.weight), mixer.out.bias.copy_(mha.out_proj.bias)
    x = torch.randn(3, 5, 8, dtype=torch.float64)
    expected = mha(x, x, x, need_weights=False)[0]
    torch.testing.assert_close(mixer(x), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("heads", [1, 2])
@pytest.mark.parametrize("eps", [0.0, 1e-6])
def test_linear_attention_mixer_matches_the_quadratic_form(heads, eps):
    torch.manual_seed(0)
    mixer = ih.LinearAttentionMixer(8, inner_channels=6, heads=heads, eps=eps).double()
    x = torch.randn(2, 9, 8, dtype=torch.float64)
    torch.testing.assert_close(mixer(x), reference_linear(mixer, x, eps), rtol=1e-12, atol=1e-12)


def test_linear_attention_function_is_normalised_like_a_weighted_mean():
    """With v = 1 every output is exactly 1 (eps = 0): the weights sum to one per query."""
    torch.manual_seed(0)
    q, k = torch.randn(2, 3, 11, 4, dtype=torch.float64), torch.randn(2, 3, 11, 4).double()
    out = linear_attention(q, k, torch.ones(2, 3, 11, 5, dtype=torch.float64), eps=0.0)
    torch.testing.assert_close(out, torch.ones_like(out), rtol=1e-13, atol=1e-13)


def _ham_mixer(name: str) -> nn.Module:
    torch.manual_seed(0)
    return ih.make_context(
        name, 6, ham_channels=5, rank=2, steps=3, eval_steps=3, init="fixed", adjoint="unroll"
    ).double()


@pytest.mark.parametrize(
    "build",
    [
        lambda: ih.SDPAMixer(6, heads=2).double(),
        lambda: ih.LinearAttentionMixer(6, heads=2).double(),
        lambda: _ham_mixer("nmf_mixer"),
        lambda: _ham_mixer("cd_mixer"),
    ],
    ids=["sdpa", "linear", "nmf", "cd"],
)
def test_mixer_gradients_match_finite_differences(build):
    """Input and first-projection weight gradients (the ham under Unroll, the exact
    derivative) against central differences in float64."""
    mixer = build()
    torch.manual_seed(2)
    x = torch.randn(2, 7, 6, dtype=torch.float64, requires_grad=True)
    first = next(p for name, p in mixer.named_parameters() if name.endswith("weight"))
    params = dict(mixer.named_parameters())
    key = next(name for name, p in params.items() if p is first)
    weight = first.detach().clone().requires_grad_(True)

    def call(inp, w):
        return torch.func.functional_call(mixer, {**params, key: w}, (inp,))

    assert torch.autograd.gradcheck(call, (x, weight), eps=1e-6, atol=1e-6, rtol=1e-5)


def test_ham_mixer_is_bidirectional():
    """The first token's output moves when only the last token changes (it sees every
    position: no causal mask), for the ham mixer and both baselines."""
    torch.manual_seed(0)
    x = torch.randn(1, 12, 6, dtype=torch.float64)
    moved = x.clone()
    moved[0, -1] += 1.0
    for mixer in (
        _ham_mixer("vq_mixer"),
        ih.SDPAMixer(6).double(),
        ih.LinearAttentionMixer(6).double(),
    ):
        mixer.eval()
        assert not torch.allclose(mixer(x)[0, 0], mixer(moved)[0, 0])


def test_mixers_are_reached_by_make_context_and_the_registry():
    names = ih.nn.context_names()
    for name in ("nmf_mixer", "vq_mixer", "cd_mixer", "sdpa_mixer", "linear_attention_mixer"):
        assert name in names
        module = ih.make_context(name, 8, **({"rank": 2} if decomposition_of(name) else {}))
        assert module(torch.randn(2, 5, 8)).shape == (2, 5, 8)
    nmf = ih.make_context("nmf_mixer", 8, rank=2, adjoint="implicit", ham_channels=4)
    assert isinstance(nmf, ih.HamMixer) and isinstance(nmf.ham, ih.NMF)
    assert isinstance(nmf.ham.adjoint, ih.Implicit) and nmf.ham.channels == 4 and nmf.lower_relu
    assert isinstance(ih.make_context("sdpa_mixer", 8, heads=2), ih.SDPAMixer)
    assert (decomposition_of("nmf"), decomposition_of("cd_mixer")) == ("nmf", "cd")
    assert decomposition_of("sdpa_mixer") is None and decomposition_of("nope_mixer") is None
    with pytest.raises(TypeError, match="version"):
        ih.make_context("nmf_mixer", 8, rank=2, version="v1")  # a Hamburger option
    with pytest.raises(TypeError, match="dual"):
        ih.make_context("nmf_mixer", 8, rank=2, dual=True)
    with pytest.raises(KeyError, match="nmf_mixer"):
        ih.make_context("nmf_mixr", 8)


@pytest.mark.parametrize("name", ["nmf_mixer", "sdpa_mixer", "linear_attention_mixer"])
def test_a_mixer_given_a_feature_map_names_the_shape_and_the_fix(name):
    mixer = ih.make_context(name, 8, **({"rank": 2} if decomposition_of(name) else {}))
    with pytest.raises(
        ValueError,
        match=r"tokens \(B, N, 8\), got shape \(2, 8, 4, 4\).*flatten\(2\)\.transpose\(1, 2\)",
    ):
        mixer(torch.randn(2, 8, 4, 4))
    with pytest.raises(ValueError, match=r"got shape \(2, 8, 5\).*x\.transpose\(1, 2\)"):
        mixer(torch.randn(2, 8, 5))  # a (B, C, N) sequence, not tokens


def test_ham_mixer_refuses_an_nmf_without_relu_and_a_channel_ham():
    with pytest.raises(ValueError, match="non-negative"):
        ih.HamMixer(8, ih.NMF(rank=2), lower_relu=False)
    with pytest.raises(ValueError, match="spatial=True"):
        ih.HamMixer(8, ih.VQ(rank=2, spatial=False))
    with pytest.raises(ValueError, match="built for channels=4 but receives 8 channels"):
        ih.HamMixer(8, ih.CD(rank=2, channels=4))


def test_ham_mixer_gives_its_width_to_the_ham():
    """A ham built without channels takes the mixer's width, so its "fixed" initial bases are
    a buffer drawn once (as in Hamburger), not redrawn from the seed at every forward."""
    mixer = ih.HamMixer(8, ih.NMF(rank=2, eval_init="fixed"), ham_channels=6).eval()
    assert mixer.ham.channels == 6 and "ham.fixed_bases" in dict(mixer.named_buffers())
    x = torch.rand(2, 5, 8)
    torch.testing.assert_close(mixer(x), mixer(x), rtol=0, atol=0)


def test_ham_mixer_names_a_dtype_or_device_mismatch():
    mixer = ih.HamMixer(8, ih.VQ(rank=2))
    with pytest.raises(TypeError, match=r"input is torch\.float64 but the module's parameters"):
        mixer(torch.randn(2, 5, 8, dtype=torch.float64))
    with pytest.raises(ValueError, match="the input is on meta"):
        mixer(torch.randn(2, 5, 8, device="meta"))


def test_an_integer_input_is_told_to_become_floating():
    """Converting the module to the input's integer dtype, or autocast, cannot help an integer
    input: the message names the one fix that does (both for HamMixer and Hamburger)."""
    for module, x in [
        (ih.HamMixer(8, ih.VQ(rank=2)), torch.randint(0, 5, (2, 5, 8))),
        (ih.Hamburger(channels=8, ham=ih.NMF(rank=2)), torch.randint(0, 5, (2, 8, 4, 4))),
    ]:
        with pytest.raises(TypeError, match=r"input is torch\.int64; a floating input is needed"):
            module(x)
