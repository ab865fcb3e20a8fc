"""Decompositions and the Hamburger block on sequences (B, C, N): the one flatten rule makes a
sequence the map (B, C, N, 1), so both give the same output; too short a sequence is refused."""

from __future__ import annotations

import pytest
import torch

import implicit_ham as ih

HAMS = {"nmf": ih.NMF, "vq": ih.VQ, "cd": ih.CD, "svd": ih.SVD}


@pytest.mark.parametrize("name", sorted(HAMS))
@pytest.mark.parametrize("spatial", [True, False])
def test_a_sequence_decomposes_like_the_map_with_one_column(name, spatial):
    torch.manual_seed(0)
    x = torch.rand(2, 8, 12, dtype=torch.float64, requires_grad=True)
    ham = HAMS[name](rank=3, steps=4, spatial=spatial, adjoint=ih.Unroll())
    d = 8 if spatial else 12
    bases = torch.rand(2, d, 3, dtype=torch.float64)
    y_seq = ham(x, init=bases)
    y_map = ham(x.unsqueeze(-1), init=bases)
    assert y_seq.shape == x.shape and y_map.shape == (2, 8, 12, 1)
    assert torch.equal(y_seq, y_map.squeeze(-1))
    weights = torch.randn_like(y_seq)
    (g_seq,) = torch.autograd.grad((y_seq * weights).sum(), x)
    (g_map,) = torch.autograd.grad((y_map.squeeze(-1) * weights).sum(), x)
    assert torch.equal(g_seq, g_map)
    # and the sequence is decomposed over its N positions: the output is rank <= 3 per sample
    if spatial:
        assert int(torch.linalg.matrix_rank(y_seq[0].detach())) <= 3


@pytest.mark.parametrize("version", ["v1", "v2", "v2+"])
def test_hamburger_on_a_sequence_equals_the_map_with_one_column(version):
    torch.manual_seed(0)
    block = ih.make_context("nmf", 8, version=version, rank=3, init="fixed").double()
    x = torch.randn(3, 8, 10, dtype=torch.float64)
    y_seq = block(x)
    y_map = block(x.unsqueeze(-1))
    assert y_seq.shape == (3, 8, 10)
    assert torch.equal(y_seq, y_map.squeeze(-1))


def test_a_sequence_shorter_than_the_rank_is_refused_naming_shape_and_fix():
    ham = ih.NMF(rank=8)
    with pytest.raises(ValueError, match=r"rank=8.*\(2, 16, 5\).*longer sequence"):
        ham(torch.rand(2, 16, 5))
    with pytest.raises(ValueError, match=r"rank=8.*longer sequence"):
        ih.make_context("cd_mixer", 16, rank=8)(torch.randn(2, 5, 16))


@pytest.mark.parametrize("shape", [(4, 8), (2, 8, 3, 3, 3)])
def test_inputs_that_are_neither_map_nor_sequence_are_refused(shape):
    with pytest.raises(
        ValueError, match=r"\(B, C, H, W\) or a sequence \(B, C, N\).*" + str(shape[-1])
    ):
        ih.VQ(rank=2)(torch.randn(*shape))
    with pytest.raises(ValueError, match=r"Hamburger expects .*got shape"):
        ih.make_context("vq", 8, rank=2)(torch.randn(*shape))
