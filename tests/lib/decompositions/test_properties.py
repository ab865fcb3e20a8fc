"""Mathematical properties of the decompositions, checked against quantities computed here:
NMF's objective never increases, VQ's soft assignments are distributions over r, CD's bases have
unit norm, and SVD converges to the projection given by ``torch.linalg.svd``."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import implicit_ham as ih


@settings(max_examples=12, deadline=None)
@given(
    d=st.integers(3, 8),
    n=st.integers(3, 10),
    rank_frac=st.floats(0.0, 0.99),
    zero_frac=st.floats(0.0, 0.5),
    seed=st.integers(0, 2**31 - 1),
)
def test_nmf_objective_is_non_increasing(d, n, rank_frac, zero_frac, seed):
    gen = torch.Generator().manual_seed(seed)
    rank = 1 + int(rank_frac * (min(d, n) - 1))
    x = torch.rand(2, d, n, generator=gen, dtype=torch.float64)
    x = x * (torch.rand(2, d, n, generator=gen, dtype=torch.float64) >= zero_frac)
    nmf = ih.NMF(rank=rank)
    d0 = torch.rand(2, d, rank, generator=gen, dtype=torch.float64)
    state = nmf.init(x, d0 / d0.norm(dim=1, keepdim=True))
    values = []
    for _ in range(20):
        bases, coef = state
        direct = ((x - bases @ coef.mT) ** 2).sum(dim=(1, 2))
        assert torch.allclose(nmf.objective(x, state), direct, rtol=1e-12, atol=1e-14)
        values.append(direct)
        state = nmf.step(x, state)
    values = torch.stack(values)
    # eps = 1e-6 in the denominators perturbs the exact Lee-Seung bound by O(eps) at most.
    slack = 1e-9 * values[0] + 1e-12
    assert bool((values[1:] <= values[:-1] + slack).all())
    assert bool(((values[-1] < values[0]) | (values[0] < 1e-12)).all())


def test_vq_assignments_are_distributions_over_r_then_normalised_over_n():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 6, 15, generator=gen, dtype=torch.float64)
    vq = ih.VQ(rank=4, inv_t=10.0)
    d0 = torch.randn(3, 6, 4, generator=gen, dtype=torch.float64)
    state = vq.init(x, d0)
    for _ in range(3):
        soft = vq.assignments(x, state[0])
        assert torch.allclose(soft.sum(dim=-1), torch.ones(3, 15, dtype=torch.float64))
        assert bool((soft > 0).all())
        state = vq.step(x, state)
        mass = soft.sum(dim=1)
        assert torch.allclose(state[1].sum(dim=1), mass / (mass + vq.eps), rtol=1e-12)
        assert torch.allclose(state[0], x @ state[1], rtol=1e-12)
    final = vq.compute_coef(x, state)
    assert torch.allclose(final.sum(dim=-1), torch.ones(3, 15, dtype=torch.float64))


def test_cd_bases_have_unit_norm_after_every_step():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 8, 20, generator=gen, dtype=torch.float64)
    cd = ih.CD(rank=3)
    d0 = torch.randn(2, 8, 3, generator=gen, dtype=torch.float64)
    state = cd.init(x, d0 / d0.norm(dim=1, keepdim=True))
    for _ in range(4):
        state = cd.step(x, state)
        norms = state[0].norm(dim=1)
        assert torch.allclose(norms, torch.ones_like(norms), atol=1e-12)


def test_cd_readout_is_the_ridge_regression_solution():
    """compute_coef minimises ||X - D C^T||^2 + beta ||C||^2: its gradient vanishes there."""
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(2, 8, 20, generator=gen, dtype=torch.float64)
    cd = ih.CD(rank=3, beta=0.3)
    bases = torch.randn(2, 8, 3, generator=gen, dtype=torch.float64)
    coef = cd.compute_coef(x, (bases, torch.zeros(2, 20, 3, dtype=torch.float64)))
    grad = -2 * (x - bases @ coef.mT).mT @ bases + 2 * 0.3 * coef
    assert grad.abs().max().item() < 1e-10


def spectrum_matrix(d: int, n: int, singular: list[float], seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    u, _ = torch.linalg.qr(torch.randn(d, d, generator=gen, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(n, n, generator=gen, dtype=torch.float64))
    s = torch.zeros(d, n, dtype=torch.float64)
    s[range(len(singular)), range(len(singular))] = torch.tensor(singular, dtype=torch.float64)
    return u @ s @ v.T


def test_svd_converges_to_the_truncated_svd_projection():
    x = spectrum_matrix(6, 10, [5.0, 2.0, 0.5, 0.4, 0.2, 0.1], seed=3)
    svd = ih.SVD(rank=2, steps=40)
    layer_out = svd(x.reshape(1, 6, 2, 5))
    u, s, vh = torch.linalg.svd(x)
    expected = u[:, :2] @ torch.diag(s[:2]) @ vh[:2]
    assert (layer_out.reshape(6, 10) - expected).abs().max().item() < 1e-10
    bases = svd.last_solution.value[0][0]
    assert torch.allclose(bases.T @ bases, torch.eye(2, dtype=torch.float64), atol=1e-12)
    # converged to the singular vectors themselves (signs fixed), a genuine fixed point
    assert torch.allclose(bases.abs(), u[:, :2].abs(), rtol=0, atol=1e-10)
    assert svd.last_solution.stats.abs_residual.max().item() < 1e-10
