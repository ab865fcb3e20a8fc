"""``VariationalDropout``: one mask per solve (the iteration keeps a fixed point), a new one
per solve, expectation preserved, identity in eval mode."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor, nn

import implicit_ham as ih


class DroppedCell(nn.Module):
    """z -> tanh(W drop(z) + x), recording the mask seen at every call."""

    def __init__(self, drop: nn.Module, width: int = 8) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.W = nn.Linear(width, width, bias=False)
        with torch.no_grad():
            self.W.weight.mul_(0.3)
        self.drop = drop
        self.seen: list[Tensor] = []

    def forward(self, z: Tensor, x: Tensor) -> Tensor:
        ones = self.drop(torch.ones_like(z))
        self.seen.append(ones.detach())
        return torch.tanh(self.W(z * ones) + x)


def test_one_mask_per_solve_and_the_solve_reaches_its_tolerance() -> None:
    cell = DroppedCell(ih.nn.VariationalDropout(0.3))
    x = torch.randn(5, 8)
    solver = ih.FixedPointIteration(max_steps=200, tol=1e-6)
    sol = ih.fixed_point(cell, torch.zeros(5, 8), x, solver=solver)
    first = cell.seen
    assert len(first) > 3
    assert all(torch.equal(m, first[0]) for m in first)
    assert bool(sol.stats.converged.all())
    kept = first[0][first[0] != 0]
    torch.testing.assert_close(kept, torch.full_like(kept, 1 / 0.7))  # scaled by 1 / (1 - p)
    cell.seen = []
    ih.fixed_point(cell, torch.zeros(5, 8), x, solver=solver)
    assert not torch.equal(cell.seen[0], first[0])  # a new solve draws a new mask


def test_expectation_is_preserved_and_eval_is_the_identity() -> None:
    drop = ih.nn.VariationalDropout(0.25)
    x = torch.ones(200, 50)
    masks = torch.stack([drop(x) for _ in range(40)])  # outside a solve: a new mask per call
    mean, stderr = float(masks.mean()), float(masks.std()) / math.sqrt(masks.numel())
    assert abs(mean - 1.0) < 4 * stderr
    drop.eval()
    assert drop(x) is x


def test_the_2d_variant_drops_whole_channels() -> None:
    drop = ih.nn.VariationalDropout2d(0.5)
    out = drop(torch.ones(3, 16, 4, 4))
    per_channel = out.reshape(3, 16, -1)
    assert bool((per_channel == per_channel[:, :, :1]).all())
    with pytest.raises(ValueError, match=r"\(B, C, H, W\)"):
        drop(torch.ones(3, 16))


@pytest.mark.parametrize("p", [-0.1, 1.0, 1.5])
def test_p_outside_its_range_is_refused(p: float) -> None:
    with pytest.raises(ValueError, match=r"p must be in \[0, 1\)"):
        ih.nn.VariationalDropout(p)
