"""The discriminator's mismatch probe and matching-aware negatives: recombined canvases break
only the pairing, a local discriminator gives a zero gap, one that compares the two digits a
positive gap, and the negatives add their hinge term to the discriminator's update."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from experiments.data.far_twins import FarTwinsDataset
from experiments.generation.d_probe import digit_cells, mismatch_gap, mismatched
from experiments.generation.job import _train_step
from experiments.generation.nets import LocalDiscriminator, LocalGenerator
from experiments.generation.trainer import hinge_d_loss


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


def test_matching_aware_negatives_add_the_hinge_fake_term_on_their_digit_cells(
    val: FarTwinsDataset,
) -> None:
    """One discriminator update with negatives equals plain SGD on the hinge loss plus
    weight * mean(relu(1 + logit)) over the negatives' two digit cells, computed by hand."""
    torch.manual_seed(0)
    generator = LocalGenerator(nn.Identity(), noise=4, width=8, depth=1, after=1)
    discriminator = LocalDiscriminator(nn.Identity(), width=8).eval()  # eval: spectral norm fixed
    real = val.canvases[:8] * 2 - 1
    negatives = mismatched(real, val.labels[:8])
    z_d, z_g = generator.noise_like(8), generator.noise_like(8)
    by_hand = copy.deepcopy(discriminator)
    with torch.no_grad():
        fake = generator(z_d)
    logits = by_hand(torch.cat([real, fake, negatives]))
    left, right = digit_cells(logits[16:])
    negative_term = F.relu(1 + torch.cat([left, right])).mean()
    loss = hinge_d_loss(logits[:8], logits[8:16]) + 0.5 * negative_term
    grads = torch.autograd.grad(loss, list(by_hand.parameters()))

    before = [p.detach().clone() for p in discriminator.parameters()]
    opt_d = torch.optim.SGD(discriminator.parameters(), lr=1.0)
    opt_g = torch.optim.SGD(generator.parameters(), lr=0.0)
    assert _train_step(generator, discriminator, opt_g, opt_d, real, z_d, z_g, negatives, 0.5) == 0
    for p, p0, g in zip(discriminator.parameters(), before, grads, strict=True):
        torch.testing.assert_close(p0 - p.detach(), g, rtol=1e-4, atol=1e-6)
    assert len(negatives) > 0
