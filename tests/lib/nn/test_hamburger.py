"""The Hamburger block: wiring of each version against a manual composition written here, no
dead parameters under any backward mode, resolution independence, initialisation, errors."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

import implicit_ham as ih

ADJOINTS = [
    ih.Unroll(),
    ih.Truncated(2),
    ih.OneStep(),
    ih.Phantom(k=2, tau=0.5),
    ih.Neumann(k=3, tau=0.5),
    ih.Implicit(max_steps=20),
]


def conv(x: torch.Tensor, layer: torch.nn.Conv2d) -> torch.Tensor:
    return F.conv2d(x, layer.weight, layer.bias)


def batch_norm(x: torch.Tensor, layer: torch.nn.BatchNorm2d) -> torch.Tensor:
    mean = x.mean(dim=(0, 2, 3), keepdim=True)
    var = x.var(dim=(0, 2, 3), unbiased=False, keepdim=True)
    w, b = layer.weight.view(1, -1, 1, 1), layer.bias.view(1, -1, 1, 1)
    return (x - mean) / torch.sqrt(var + layer.eps) * w + b


def manual(block: ih.Hamburger, x: torch.Tensor) -> torch.Tensor:
    """The block's equations in training mode, from its weights (docs/hamburger.md §1)."""
    h = conv(x, block.lower_bread[0])
    if block.lower_relu:  # the official block: a ReLU for the non-negative hams (NMF) only
        h = torch.relu(h)
    if block.channel_ham is None:
        h = block.ham(h)
    else:
        half = h.shape[1] // 2
        h = torch.cat([block.ham(h[:, :half]), block.channel_ham(h[:, half:])], dim=1)
    if block.version == "v1":
        upper = batch_norm(conv(h, block.upper_bread[0]), block.upper_bread[1])
        return torch.relu(x + upper)
    h = torch.relu(batch_norm(conv(h, block.cheese[0]), block.cheese[1]))
    upper = conv(h, block.upper_bread)
    if block.version == "v2":
        return torch.relu(x + upper)
    return torch.relu(block.coef_ham * upper + block.coef_shortcut * x)


def build(version: str, dual: bool = False, kind: str = "nmf", **ham_kw) -> ih.Hamburger:
    ham = ih.make_decomposition(kind, rank=3, steps=3, **ham_kw)
    channel_ham = ih.make_decomposition(kind, rank=3, steps=3, spatial=False, **ham_kw)
    return ih.Hamburger(12, ham, version, ham_channels=8, channel_ham=channel_ham if dual else None)


CASES = [("v1", False), ("v2", False), ("v2+", False), ("v2+", True)]


@pytest.mark.parametrize(("version", "dual"), CASES)
def test_forward_matches_the_manual_composition(version, dual):
    torch.manual_seed(0)
    block = build(version, dual, kind="cd")
    if version == "v2+":
        with torch.no_grad():
            block.coef_ham.fill_(0.7)
            block.coef_shortcut.fill_(1.3)
    x = torch.randn(2, 12, 5, 6)
    torch.manual_seed(1)
    out = block(x)
    torch.manual_seed(1)
    expected = manual(block, x)
    assert out.shape == x.shape
    assert torch.allclose(out, expected, atol=1e-5)


def test_structure_of_each_version():
    v1, v2, v2p = build("v1"), build("v2"), build("v2+")
    assert v1.cheese is None and isinstance(v1.upper_bread[1], torch.nn.BatchNorm2d)
    assert v1.upper_bread[0].bias is None and v1.lower_bread[0].bias is not None
    for block in (v2, v2p):
        assert isinstance(block.upper_bread, torch.nn.Conv2d) and block.upper_bread.bias is None
        assert isinstance(block.cheese[1], torch.nn.BatchNorm2d) and block.cheese[0].bias is None
    assert not hasattr(v2, "coef_ham")
    assert v2p.coef_ham.item() == 0.0 and v2p.coef_shortcut.item() == 1.0
    assert build("v2+", dual=True).lower_bread[0].out_channels == 16


def test_v2_plus_starts_as_the_shortcut_and_only_its_blend_scalars_learn_at_first():
    block = build("v2+", dual=True, kind="vq")
    x = torch.randn(2, 12, 4, 4)
    out = block(x)
    assert torch.equal(out, torch.relu(x))
    (out * torch.randn_like(out)).sum().backward()
    assert block.coef_ham.grad.abs().item() > 0 and block.coef_shortcut.grad.abs().item() > 0
    assert block.lower_bread[0].weight.grad.abs().max().item() == 0


@pytest.mark.parametrize(("version", "dual"), CASES)
def test_every_parameter_gets_a_gradient_under_every_backward_mode(version, dual):
    """No dead parameters. In v2+, coef_ham is set to 0.5 first (at its init value 0 the
    parameters upstream of it get exactly zero gradient, see the test above)."""
    torch.manual_seed(2)
    block = build(version, dual, kind="cd" if dual else "nmf")
    if version == "v2+":
        with torch.no_grad():
            block.coef_ham.fill_(0.5)
    x = torch.randn(2, 12, 5, 4)
    weight = torch.randn_like(x)
    for adjoint in ADJOINTS:
        for ham in (block.ham, block.channel_ham):
            if ham is not None:
                ham.adjoint = adjoint
        block.zero_grad(set_to_none=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ih.ConvergenceWarning)
            (block(x) * weight).sum().backward()
        for name, param in block.named_parameters():
            assert param.grad is not None, (adjoint, name)
            assert torch.isfinite(param.grad).all(), (adjoint, name)
            assert param.grad.abs().max().item() > 0, (adjoint, name)


@pytest.mark.parametrize("name", ["nmf", "vq", "cd", "svd", "self_attention", "sdpa_attention"])
def test_the_same_module_runs_on_two_resolutions(name):
    kwargs = {"rank": 4} if name in ih.plugins.DECOMPOSITIONS.names() else {}
    module = ih.make_context(name, channels=16, **kwargs)
    for shape in ((2, 16, 16, 16), (1, 16, 48, 40)):
        out = module(torch.randn(shape))
        assert out.shape == shape and torch.isfinite(out).all()


def test_conv_and_batchnorm_initialisation():
    block = ih.Hamburger(256, ih.CD(rank=4), "v1", ham_channels=256)
    for conv_layer in (block.lower_bread[0], block.upper_bread[0]):
        std = conv_layer.weight.std().item()
        expected = (2.0 / conv_layer.out_channels) ** 0.5  # kaiming normal, fan_out, ReLU gain
        assert abs(std / expected - 1) < 0.05
    bn = block.upper_bread[1]
    assert torch.equal(bn.weight, torch.ones(256)) and torch.equal(bn.bias, torch.zeros(256))


def test_construction_errors_name_the_fix():
    with pytest.raises(ValueError, match="non-negative input; keep lower_relu=True"):
        ih.Hamburger(8, ih.NMF(rank=2), lower_relu=False)
    with pytest.raises(ValueError, match="version must be one of v1, v2, v2\\+"):
        ih.Hamburger(8, ih.CD(rank=2), version="v3")
    with pytest.raises(ValueError, match="only in version 'v2\\+'"):
        ih.Hamburger(8, ih.CD(rank=2), "v2", channel_ham=ih.CD(rank=2, spatial=False))
    with pytest.raises(ValueError, match="channel_ham spatial=False"):
        ih.Hamburger(8, ih.CD(rank=2), "v2+", channel_ham=ih.CD(rank=2))
    with pytest.raises(ValueError, match="built for channels=16 but receives ham_channels=8"):
        ih.Hamburger(8, ih.CD(rank=2, channels=16))
    with pytest.raises(TypeError, match=r"ih\.Decomposition"):
        ih.Hamburger(8, torch.nn.Identity())


def test_signed_ham_without_relu_and_readable_repr():
    block = ih.Hamburger(8, ih.CD(rank=2), "v2")
    assert [type(m) for m in block.lower_bread] == [torch.nn.Conv2d]
    assert block(torch.randn(1, 8, 4, 4)).shape == (1, 8, 4, 4)
    text = repr(build("v2+", dual=True))
    assert "channels=12, ham_channels=8, version='v2+', dual=True" in text
    assert "NMF(rank=3" in text and "spatial=False" in text
