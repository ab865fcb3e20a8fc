"""Attention baselines, the identity baseline and the ``make_context`` factory."""

from __future__ import annotations

import pytest
import torch

import implicit_ham as ih


def reference_attention(module, x: torch.Tensor) -> torch.Tensor:
    """out = x + W_o [softmax(Q_h^T K_h / sqrt(d_h)) V_h]_h, written with explicit loops."""
    b, c, h, w = x.shape
    n = h * w

    def project(conv):
        return torch.einsum(
            "oc,bcn->bon", conv.weight[:, :, 0, 0], x.reshape(b, c, n)
        ) + conv.bias.view(1, -1, 1)

    q, k, v = project(module.query), project(module.key), project(module.value)
    dh = module.inner_channels // module.heads
    heads = []
    for i in range(module.heads):
        sl = slice(i * dh, (i + 1) * dh)
        scores = q[:, sl].transpose(1, 2) @ k[:, sl] / dh**0.5  # (b, n, n)
        weights = torch.exp(scores - scores.amax(dim=-1, keepdim=True))
        weights = weights / weights.sum(dim=-1, keepdim=True)
        heads.append((weights @ v[:, sl].transpose(1, 2)).transpose(1, 2))  # (b, dh, n)
    mixed = torch.cat(heads, dim=1)
    out = torch.einsum("oc,bcn->bon", module.out.weight[:, :, 0, 0], mixed)
    return x + (out + module.out.bias.view(1, -1, 1)).reshape(b, c, h, w)


@pytest.mark.parametrize("heads", [1, 2])
def test_self_attention_and_sdpa_match_the_reference(heads):
    torch.manual_seed(0)
    sa = ih.SelfAttention2d(8, inner_channels=6, heads=heads).double()
    sdpa = ih.SDPAttention2d(8, inner_channels=6, heads=heads).double()
    sdpa.load_state_dict(sa.state_dict())
    x = torch.randn(2, 8, 5, 3, dtype=torch.float64)
    expected = reference_attention(sa, x)
    assert (sa(x) - expected).abs().max().item() < 1e-12
    assert (sdpa(x) - expected).abs().max().item() < 1e-12


def test_attention_parameter_count_and_errors():
    sa = ih.SelfAttention2d(32)
    assert sum(p.numel() for p in sa.parameters()) == 4 * 32 * 32 + 4 * 32
    assert "channels=32, inner_channels=32, heads=1" in repr(sa)
    with pytest.raises(ValueError, match="not divisible by heads=3"):
        ih.SDPAttention2d(8, heads=3)
    with pytest.raises(ValueError, match=r"expects \(B, 8, H, W\)"):
        sa_small = ih.SelfAttention2d(8)
        sa_small(torch.randn(1, 4, 2, 2))


def test_identity_context():
    x = torch.randn(2, 4, 3, 3)
    assert ih.IdentityContext()(x) is x
    assert list(ih.IdentityContext(4).parameters()) == []
    with pytest.raises(ValueError, match=r"expects \(B, 5, H, W\)"):
        ih.IdentityContext(5)(x)


def test_make_context_builds_every_name():
    names = ih.plugins.context_names()
    assert {"nmf", "vq", "cd", "svd", "self_attention", "sdpa_attention", "none"} <= set(names)
    x, tokens = torch.randn(2, 16, 6, 6), torch.randn(2, 36, 16)
    for name in names:
        kwargs = {"rank": 3} if ih.nn.decomposition_of(name) is not None else {}
        module = ih.make_context(name, 16, **kwargs)
        inputs = tokens if name.endswith("_mixer") else x  # token mixers: (B, N, C)
        assert module(inputs).shape == inputs.shape, name
    block = ih.make_context(
        "cd",
        16,
        rank=3,
        version="v2+",
        dual=True,
        ham_channels=8,
        steps=2,
        adjoint=ih.Unroll(),
        beta=0.3,
    )
    assert isinstance(block, ih.Hamburger) and block.version == "v2+"
    assert block.ham.spatial and not block.channel_ham.spatial
    assert block.ham.beta == 0.3 and isinstance(block.channel_ham.adjoint, ih.Unroll)
    assert isinstance(ih.make_context("self_attention", 16, heads=2), ih.SelfAttention2d)


def test_make_context_errors_list_the_choices():
    with pytest.raises(KeyError, match=r"unknown context 'attention'.*none.*self_attention"):
        ih.make_context("attention", 8)
    with pytest.raises(TypeError, match="rnk"):
        ih.make_context("nmf", 8, rnk=3)
    with pytest.raises(TypeError, match="spatial"):
        ih.make_context("nmf", 8, rank=3, spatial=False)
    with pytest.raises(TypeError, match="unknown option"):
        ih.make_context("self_attention", 8, rank=3)
