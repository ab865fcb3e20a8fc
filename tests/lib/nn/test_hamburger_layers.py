"""Injectable ``norm_layer`` / ``act_layer`` in the Hamburger block: the defaults are unchanged
(BatchNorm, ReLU), an injected layer sits exactly where the block normalises / activates (its
output against a manual composition with ``F.group_norm`` / ``F.gelu``), ``make_context``
forwards them, and bad layers are refused with the reason."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import implicit_ham as ih
from implicit_ham.nn import group_norm


def _block(version: str, **kwargs) -> ih.Hamburger:
    ham = ih.NMF(rank=3, steps=3, eval_init="fixed", channels=8)
    return ih.Hamburger(12, ham, version, ham_channels=8, **kwargs).eval()


def _perturb(block: nn.Module) -> None:
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for m in block.modules():
            if isinstance(m, nn.GroupNorm):
                m.weight.copy_(1 + 0.3 * torch.randn(m.weight.shape, generator=g))
                m.bias.copy_(0.3 * torch.randn(m.bias.shape, generator=g))


def test_defaults_are_batch_norm_and_relu() -> None:
    v1, v2 = _block("v1"), _block("v2")
    assert isinstance(v1.upper_bread[1], nn.BatchNorm2d)
    assert isinstance(v2.cheese[1], nn.BatchNorm2d) and isinstance(v2.cheese[2], nn.ReLU)
    assert isinstance(v1.act, nn.ReLU) and v1.act.inplace


def test_v1_with_group_norm_is_the_manual_composition() -> None:
    block = _block("v1", norm_layer=group_norm(4))
    _perturb(block)
    x = torch.randn(2, 12, 5, 5)
    with torch.no_grad():
        h = torch.relu(F.conv2d(x, block.lower_bread[0].weight, block.lower_bread[0].bias))
        h = block.ham(h)
        norm = block.upper_bread[1]
        h = F.group_norm(F.conv2d(h, block.upper_bread[0].weight), 4, norm.weight, norm.bias)
        expected = torch.relu(x + h)
        assert torch.allclose(block(x), expected, atol=1e-6)


def test_v2_with_gelu_is_the_manual_composition_and_keeps_the_lower_relu() -> None:
    block = _block("v2", norm_layer=group_norm(2), act_layer=nn.GELU)
    _perturb(block)
    assert isinstance(block.lower_bread[1], nn.ReLU)  # NMF's domain, not an act_layer
    x = torch.randn(2, 12, 5, 5)
    with torch.no_grad():
        h = block.ham(torch.relu(block.lower_bread[0](x)))
        norm = block.cheese[1]
        h = F.gelu(F.group_norm(F.conv2d(h, block.cheese[0].weight), 2, norm.weight, norm.bias))
        expected = F.gelu(x + F.conv2d(h, block.upper_bread.weight))
        assert torch.allclose(block(x), expected, atol=1e-6)


def test_make_context_forwards_the_layers() -> None:
    block = ih.make_context(
        "vq", 16, rank=3, version="v2", norm_layer=group_norm(8), act_layer=nn.SiLU
    )
    assert isinstance(block.cheese[1], nn.GroupNorm) and block.cheese[1].num_groups == 8
    assert isinstance(block.cheese[2], nn.SiLU) and isinstance(block.act, nn.SiLU)


def test_bad_layers_are_refused_with_the_reason() -> None:
    with pytest.raises(ValueError, match=r"upper bread norm on 12 channels: GroupNorm\(5\)"):
        _block("v1", norm_layer=group_norm(5))
    with pytest.raises(ValueError, match="cheese norm on 8 channels"):
        _block("v2", norm_layer=group_norm(3))
    with pytest.raises(TypeError, match="norm_layer must be a callable"):
        _block("v1", norm_layer="gn")
    with pytest.raises(TypeError, match=r"act_layer must be a callable \(\) -> nn.Module"):
        _block("v1", act_layer=torch.relu)
    with pytest.raises(ValueError, match="groups must be an integer >= 1"):
        group_norm(0)
