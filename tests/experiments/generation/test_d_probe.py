"""The discriminator's mismatch probe: recombined canvases break only the pairing, a local
discriminator gives a zero gap, one that compares the two digits a positive gap."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from experiments.data.far_twins import FarTwinsDataset
from experiments.generation.d_probe import mismatch_gap, mismatched
from experiments.generation.nets import LocalDiscriminator


@pytest.fixture(scope="module")
def val() -> FarTwinsDataset:
    return FarTwinsDataset("val", 64)


def test_recombined_canvases_keep_real_digits_and_break_the_class_pairing(
    val: FarTwinsDataset,
) -> None:
    canvases, labels = val.canvases, val.labels
    out = mismatched(canvases, labels)
    keep = [i for i in range(len(labels)) if labels[i] != labels[(i + 1) % len(labels)]]
    assert len(out) == len(keep) > 0
    for row, i in enumerate(keep):
        j = (i + 1) % len(labels)
        assert torch.equal(out[row, ..., :16], canvases[i, ..., :16])
        assert torch.equal(out[row, ..., 16:], canvases[j, ..., 16:])
    with pytest.raises(ValueError, match="one label each"):
        mismatched(canvases, labels[:-1])


def test_a_discriminator_without_context_has_no_gap(val: FarTwinsDataset) -> None:
    torch.manual_seed(0)
    local = LocalDiscriminator(nn.Identity(), width=16)  # gate closed: no path between cells
    gap = mismatch_gap(local, val.canvases, val.labels)
    assert abs(gap) < 1e-5
    assert local.training  # the probe restores the mode


class Comparer(nn.Module):
    """Logit of every cell: minus the squared difference of the two digits (a perfect twin
    detector for identical digits, and a higher score for similar ones)."""

    def forward(self, x: Tensor) -> Tensor:
        left, right = x[:, 0, 8:16, 0:8], x[:, 0, 8:16, 24:32]
        score = -(left - right).pow(2).mean((1, 2))
        return score[:, None, None].expand(-1, 4, 4)


def test_a_discriminator_that_compares_the_digits_has_a_positive_gap(
    val: FarTwinsDataset,
) -> None:
    # same-class digits are closer than different-class ones, so the real pairs score higher
    assert mismatch_gap(Comparer(), val.canvases, val.labels) > 0.01
