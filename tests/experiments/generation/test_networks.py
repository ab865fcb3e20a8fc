"""The discriminator scores real and fake canvases in one concatenated pass
(``GanTraining.train_step``). That is the loss of two separate passes only if no layer couples
the samples of a batch: a sample's logit must not depend on the other samples beside it."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

import implicit_ham as ih
from experiments.models.gan import Discriminator

WIDTH = 16


class BatchCentring(nn.Module):
    """A context that couples the batch (subtracts the batch mean): the negative control."""

    def forward(self, z: Tensor) -> Tensor:
        return z - z.mean(dim=0, keepdim=True)


def _logits_of_first(disc: Discriminator, real: Tensor, others: Tensor) -> Tensor:
    torch.manual_seed(1)  # the same random initial bases for NMF in both calls
    with torch.no_grad():
        return disc(torch.cat([real, others]))[: len(real)]


@pytest.mark.parametrize(
    ("context", "coupled"),
    [
        (ih.IdentityContext, False),
        (lambda: ih.SelfAttention2d(WIDTH), False),
        (lambda: ih.Hamburger(WIDTH, ih.NMF(rank=4, steps=6)), False),
        (BatchCentring, True),
    ],
    ids=["none", "self_attention", "nmf", "batch_centring"],
)
def test_a_samples_logit_does_not_depend_on_the_rest_of_the_batch(context, coupled) -> None:
    torch.manual_seed(0)
    disc = Discriminator(context(), width=WIDTH).double().eval()  # eval: no power iteration
    with torch.no_grad():
        disc.context.gamma.fill_(0.7)  # let the context block act (it starts gated off)
    real, fake_a, fake_b = (torch.rand(5, 1, 32, 32, dtype=torch.float64) * 2 - 1 for _ in "abc")
    first = _logits_of_first(disc, real, fake_a)
    second = _logits_of_first(disc, real, fake_b)
    assert torch.allclose(first, second, rtol=1e-10, atol=1e-12) != coupled
