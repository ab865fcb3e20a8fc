"""``LightHamHead`` (SegNeXt's decode head): float64 parity with an independent
re-implementation written from mmseg's published source (tests/helpers/light_ham_reference.py;
the comparison with mmseg itself is test_light_ham_mmseg.py), the SegNeXt-T parameter count by
mmcv's ConvModule rules, injected norm / activation layers, deterministic evaluation, the mmseg
checkpoint conversion and the errors on bad input."""

from __future__ import annotations

import functools
import io

import pytest
import torch
from helpers.light_ham_reference import light_ham_head as reference
from torch import nn

import implicit_ham as ih
from implicit_ham.nn import group_norm, mmseg_state_dict, segnext_nmf

# this head's parameter names -> mmseg's (written out here, independently of mmseg_state_dict)
TO_MMSEG = {
    "squeeze.conv.": "squeeze.conv.",
    "squeeze.norm.": "squeeze.gn.",
    "hamburger.lower_bread.0.": "hamburger.ham_in.conv.",
    "hamburger.upper_bread.0.": "hamburger.ham_out.conv.",
    "hamburger.upper_bread.1.": "hamburger.ham_out.gn.",
    "align.conv.": "align.conv.",
    "align.norm.": "align.gn.",
    "conv_seg.": "conv_seg.",
}


def mmseg_names(head: nn.Module) -> dict[str, torch.Tensor]:
    out = {}
    for name, p in head.named_parameters():
        prefix = next(k for k in TO_MMSEG if name.startswith(k))
        out[TO_MMSEG[prefix] + name[len(prefix) :]] = p
    return out


def small_head(**kwargs) -> ih.LightHamHead:
    options = dict(num_classes=5, in_index=[1, 2, 3], ham_channels=64, dropout_ratio=0.1)
    options.update(kwargs)
    return ih.LightHamHead([16, 24, 32], 32, **options).double()


def features(batch: int = 2, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shapes = [(8, 24, 24), (16, 12, 12), (24, 6, 6), (32, 3, 4)]
    return [torch.rand(batch, *s, generator=g, dtype=torch.float64) for s in shapes]


def perturb(head: nn.Module) -> None:
    """Random norm affine parameters, so the test sees them (their init is 1 and 0)."""
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for m in head.modules():
            if isinstance(m, nn.GroupNorm | nn.BatchNorm2d):
                m.weight.copy_(1 + 0.3 * torch.randn(m.weight.shape, generator=g))
                m.bias.copy_(0.3 * torch.randn(m.bias.shape, generator=g))


def test_training_forward_and_gradients_match_the_reference() -> None:
    head = small_head()
    perturb(head)
    x = [t.requires_grad_() for t in features()]
    weight = torch.randn(2, 5, 12, 12, dtype=torch.float64)
    torch.manual_seed(11)
    out = head(x)
    (out * weight).sum().backward()
    ours = {"out": out.detach(), **{n: p.grad.clone() for n, p in mmseg_names(head).items()}}
    ours.update({f"x{i}": x[i].grad.clone() for i in (1, 2, 3)})
    head.zero_grad()
    x_ref = [t.detach().clone().requires_grad_() for t in x]
    params = mmseg_names(head)
    torch.manual_seed(11)  # the reference draws its bases, then the dropout mask, as the head
    expected = reference(
        params, x_ref, in_index=[1, 2, 3], rank=16, training=True, dropout_ratio=0.1
    )
    (expected * weight).sum().backward()
    refs = {"out": expected.detach(), **{n: p.grad for n, p in params.items()}}
    refs.update({f"x{i}": x_ref[i].grad for i in (1, 2, 3)})
    assert out.shape == (2, 5, 12, 12)
    assert (out.detach() != 0).any() and bool((x_ref[3].grad != 0).any())
    for key, value in refs.items():
        assert (ours[key] - value).abs().max() <= 1e-10, key
    assert x[0].grad is None  # level 0 is not selected


def test_evaluation_with_fixed_bases_matches_the_reference_and_is_deterministic() -> None:
    head = small_head(ham=segnext_nmf(64, eval_init="fixed")).eval()
    perturb(head)
    x = features()
    fixed = head.ham.fixed_bases
    assert fixed.shape == (1, 64, 16) and torch.allclose(
        fixed.norm(dim=1), torch.ones(1, 16).double()
    )
    with torch.no_grad():
        torch.manual_seed(0)
        first = head(x)
        torch.manual_seed(1)
        second = head(x)
        expected = reference(
            mmseg_names(head),
            x,
            in_index=[1, 2, 3],
            rank=16,
            training=False,
            dropout_ratio=0.1,
            bases=fixed.repeat(2, 1, 1),
        )
    assert torch.equal(first, second)
    assert (first - expected).abs().max() <= 1e-10
    buffer = io.BytesIO()
    torch.save(head.state_dict(), buffer)
    buffer.seek(0)
    loaded = small_head(ham=segnext_nmf(64, eval_init="fixed", init_seed=5)).eval()
    assert not torch.equal(loaded.ham.fixed_bases, fixed)  # another seed, until loaded
    loaded.load_state_dict(torch.load(buffer))
    with torch.no_grad():
        assert torch.equal(loaded(x), first)


def test_random_evaluation_draws_bases_like_the_reference() -> None:
    head = small_head().eval()
    x = features()
    with torch.no_grad():
        torch.manual_seed(4)
        out = head(x)
        torch.manual_seed(4)
        expected = reference(
            mmseg_names(head), x, in_index=[1, 2, 3], rank=16, training=False, dropout_ratio=0.1
        )
        torch.manual_seed(5)
        other = head(x)
    assert (out - expected).abs().max() <= 1e-10
    assert not torch.equal(out, other)  # the paper's random init: evaluation varies


def test_segnext_t_parameter_count_follows_the_conv_module_rules() -> None:
    head = ih.LightHamHead(
        [64, 160, 256], 256, num_classes=150, in_index=[1, 2, 3], ham_channels=256
    )
    # a conv has a bias only where no norm follows (ham_in, conv_seg); GN has 2 per channel
    squeeze = (64 + 160 + 256) * 256 + 2 * 256  # 480 -> 256 conv, GN(32, 256)
    ham_in = 256 * 256 + 256  # conv with bias, no norm
    ham_out = 256 * 256 + 2 * 256  # conv without bias, GN
    align = 256 * 256 + 2 * 256
    conv_seg = 256 * 150 + 150
    assert squeeze + ham_in + ham_out + align + conv_seg == 359_830
    assert sum(p.numel() for p in head.parameters()) == 359_830
    assert head.ham.rank == 16 and (head.ham.steps, head.ham.eval_steps) == (6, 7)
    assert head.ham.inv_t == 1.0 and isinstance(head.ham.adjoint, ih.Unroll)


def test_an_injected_norm_is_used_everywhere_the_head_normalises() -> None:
    head = small_head(norm_layer=group_norm(8))
    perturb(head)
    norms = [m for m in head.modules() if isinstance(m, nn.GroupNorm)]
    assert len(norms) == 3 and all(m.num_groups == 8 for m in norms)
    x = features()
    with torch.no_grad():
        torch.manual_seed(2)
        out = head(x)
        torch.manual_seed(2)
        expected = reference(
            mmseg_names(head),
            x,
            in_index=[1, 2, 3],
            rank=16,
            training=True,
            dropout_ratio=0.1,
            groups=8,
        )
    assert (out - expected).abs().max() <= 1e-10
    bn = small_head(norm_layer=nn.BatchNorm2d, act_layer=nn.GELU)
    assert sum(isinstance(m, nn.BatchNorm2d) for m in bn.modules()) == 3
    assert isinstance(bn.squeeze.act, nn.GELU) and isinstance(bn.align.act, nn.GELU)
    assert isinstance(bn.hamburger.act, nn.ReLU)  # the Hamburger's ReLUs are SegNeXt's
    assert bn(features()).shape == (2, 5, 12, 12)


def test_mmseg_state_dict_renames_mmseg_keys() -> None:
    head = small_head(ham=segnext_nmf(64, eval_init="fixed"))
    theirs = {k: v.clone() for k, v in mmseg_names(head).items()}
    theirs["hamburger.ham.bases"] = head.ham.fixed_bases.clone()
    converted = mmseg_state_dict(
        {f"decode_head.{k}": v for k, v in theirs.items()}
        | {"backbone.stem.weight": torch.zeros(1)}
    )
    assert converted.keys() == head.state_dict().keys()
    for key, value in head.state_dict().items():
        assert torch.equal(converted[key], value), key
    with pytest.raises(KeyError, match="not a key of mmseg's LightHamHead"):
        mmseg_state_dict({"squeeze.weight": torch.zeros(1)})


def test_first_selected_level_sets_the_output_size_and_in_index_defaults_to_all() -> None:
    x = features()
    head = ih.LightHamHead([8, 16, 24, 32], 32, num_classes=3, ham_channels=64).double()
    assert head.in_index == [0, 1, 2, 3] and head(x).shape == (2, 3, 24, 24)
    reordered = ih.LightHamHead(
        [32, 16], 32, num_classes=3, in_index=[3, 1], ham_channels=32, ham=segnext_nmf(32, 4)
    )
    assert reordered.double()(x).shape == (2, 3, 3, 4)


def test_bad_levels_are_refused_with_the_reason() -> None:
    head = small_head()
    x = features()
    with pytest.raises(ValueError, match="cannot be aligned"):
        head([x[0], x[1], x[2], x[3][:1]])  # batch sizes differ
    with pytest.raises(ValueError, match="cannot be aligned"):
        head([x[0], x[1], x[2], x[3][:, :, :0]])  # an empty level
    with pytest.raises(ValueError, match=r"not \(B, C, H, W\)"):
        head([x[0], x[1], x[2], x[3][0]])
    with pytest.raises(ValueError, match=r"selects level\(s\) \[3\].*3 level"):
        head(x[:3])
    with pytest.raises(ValueError, match="has 24 channels but in_channels says 16"):
        head([x[0], x[2], x[2], x[3]])
    with pytest.raises(TypeError, match="list or tuple of feature maps"):
        head(torch.cat([x[1]], dim=1))


def test_bad_construction_is_refused_with_the_fix() -> None:
    with pytest.raises(ValueError, match=r"GroupNorm\(32\) cannot normalise 48 channels"):
        ih.LightHamHead([16], 48, num_classes=2, ham_channels=64)
    with pytest.raises(ValueError, match="squeeze norm on 40 channels"):
        ih.LightHamHead([16], 32, num_classes=2, ham_channels=40, ham=ih.NMF(rank=4, channels=40))
    with pytest.raises(ValueError, match="squeeze norm on 48 channels"):  # torch's own error
        ih.LightHamHead(
            [16], 32, num_classes=2, ham_channels=48, norm_layer=functools.partial(nn.GroupNorm, 32)
        )
    with pytest.raises(ValueError, match="gives 2"):
        ih.LightHamHead([16, 24], 32, num_classes=2, in_index=[0, 1, 2])
    with pytest.raises(ValueError, match="dropout_ratio"):
        ih.LightHamHead([16], 32, num_classes=2, dropout_ratio=1.0)
    with pytest.raises(ValueError, match="ham_channels=64"):
        ih.LightHamHead([16], 32, num_classes=2, ham_channels=64, ham=segnext_nmf(32))
    with pytest.raises(TypeError, match="softmax temperature of 1"):
        segnext_nmf(64, inv_t=100.0)
