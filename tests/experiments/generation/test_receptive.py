"""Receptive fields: the analytic formula and the gradient probe against hand-derived values, and
the generation networks' only global path being the context block."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from experiments.generation.job import GanJob, build_networks
from experiments.generation.receptive import (
    analytic_receptive_field,
    dependency,
    discriminator_field,
    extent,
    generator_field,
)


def test_analytic_receptive_field_matches_hand_derived_stacks() -> None:
    # conv3 + conv3: 1 + 2 + 2 = 5; conv3/2 then conv3: 1 + 2 + 2*2 = 7;
    # conv4/2, conv4/2, conv3: 1 + 3 + 3*2 + 2*4 = 18
    assert analytic_receptive_field([(3, 1), (3, 1)]) == 5
    assert analytic_receptive_field([(3, 2), (3, 1)]) == 7
    assert analytic_receptive_field([(4, 2), (4, 2), (3, 1)]) == 18
    with pytest.raises(ValueError, match="bad layer"):
        analytic_receptive_field([(0, 1)])


@pytest.mark.parametrize(("layers", "expected"), [([(3, 1), (3, 1)], 5), ([(3, 2), (3, 1)], 7)])
def test_probe_measures_the_hand_derived_field(layers: list, expected: int) -> None:
    torch.manual_seed(0)
    stack = nn.Sequential(*(nn.Conv2d(2, 2, k, stride=s, padding=k // 2) for k, s in layers))
    stack = stack.double()
    x = torch.randn(1, 2, 32, 32, dtype=torch.float64)
    top, bottom, first, last = extent(dependency(stack, x, 4, 4))  # an interior location
    assert bottom - top + 1 == expected
    assert last - first + 1 == expected


def _nets(arm: str):
    return build_networks(GanJob(arm, 0))


def test_without_context_the_digits_are_decoupled_in_both_networks() -> None:
    generator, discriminator = _nets("none")
    g, d = generator_field(generator), discriminator_field(discriminator)
    # a pixel depends on its own cell's noise vector only; a logit sees its own cell only
    assert (g.cells, g.pixels, g.digits_share_input) == (1, 8, False)
    assert (d.pixels, d.sees_both_digits) == (8, False)
    # output pixel (9, 2) (the left digit's cell (1, 0)) depends on noise cell (1, 0) alone
    z = generator.noise_like(1, torch.Generator().manual_seed(1))
    mask = dependency(generator.double(), z.double(), 9, 2)
    assert mask[1, 0] and int(mask.sum()) == 1


@pytest.mark.parametrize("arm", ["self_attention", "nmf_one_step"])
def test_a_context_block_couples_the_digits(arm: str) -> None:
    generator, discriminator = _nets(arm)
    g, d = generator_field(generator), discriminator_field(discriminator)
    assert g.digits_share_input and d.sees_both_digits
    assert g.cells == 4 and d.pixels == 32  # the whole noise map / canvas
