"""The global-average-pooling context ("gap"): z + W mean(z) + b, against the formula in float64."""

from __future__ import annotations

import pytest
import torch

import implicit_ham as ih


def test_gap_adds_the_projected_spatial_mean_to_every_pixel() -> None:
    torch.manual_seed(0)
    module = ih.make_context("gap", 5).double()
    assert isinstance(module, ih.GlobalPoolContext)
    z = torch.randn(3, 5, 4, 6, dtype=torch.float64)
    weight = module.project.weight[:, :, 0, 0]
    mean = z.reshape(3, 5, -1).sum(-1) / 24  # (B, C)
    expected = z + (mean @ weight.T + module.project.bias)[:, :, None, None]
    torch.testing.assert_close(module(z), expected, rtol=0, atol=1e-12)
    assert sum(p.numel() for p in module.parameters()) == 5 * 5 + 5


def test_gap_is_listed_and_rejects_a_wrong_channel_count() -> None:
    assert "gap" in ih.nn.context_names()
    with pytest.raises(ValueError, match="expects \\(B, 5, H, W\\)"):
        ih.make_context("gap", 5)(torch.randn(1, 4, 2, 2))


def test_a_sequence_gets_the_output_of_its_map() -> None:
    """(B, C, N) follows the decompositions' flatten rule: the same as the (B, C, N, 1) map."""
    torch.manual_seed(0)
    gap = ih.make_context("gap", 6).double()
    z = torch.randn(2, 6, 10, dtype=torch.float64)
    torch.testing.assert_close(gap(z), gap(z[..., None])[..., 0], rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"\(B, 6, N\) sequences"):
        gap(torch.randn(2, 6))
