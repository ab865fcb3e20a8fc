"""Offline generation metrics against independent numpy / scipy computations: FID (scipy's
sqrtm), KID (the unbiased polynomial-kernel MMD^2), k-NN precision / recall (brute-force
loops), and the consistency score."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg
import torch
from torch import nn

from experiments.generation.metrics import (
    agreement_kappa,
    consistency,
    fid_kid,
    knn_radii,
    precision_recall,
)


def fid_scipy(a: np.ndarray, b: np.ndarray) -> float:
    mu_a, mu_b = a.mean(0), b.mean(0)
    cov_a, cov_b = np.cov(a, rowvar=False), np.cov(b, rowvar=False)
    root = scipy.linalg.sqrtm(cov_a @ cov_b).real
    return float(((mu_a - mu_b) ** 2).sum() + np.trace(cov_a + cov_b - 2 * root))


def kid_numpy(a: np.ndarray, b: np.ndarray) -> float:
    """Unbiased MMD^2 with k(x, y) = (x.y / dim + 1)^3 over the full sets (equal sizes)."""
    dim, m = a.shape[1], a.shape[0]
    k = lambda x, y: (x @ y.T / dim + 1) ** 3  # noqa: E731
    kxx, kyy, kxy = k(a, a), k(b, b), k(a, b)
    off = (kxx.sum() - np.trace(kxx) + kyy.sum() - np.trace(kyy)) / (m * (m - 1))
    return float(off - 2 * kxy.sum() / m**2)


@pytest.fixture(scope="module")
def features() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    mixing = torch.randn(6, 6, generator=g, dtype=torch.float64)
    real = torch.randn(300, 6, generator=g, dtype=torch.float64) @ mixing
    other = torch.randn(300, 6, generator=g, dtype=torch.float64) @ mixing
    return real, other


def test_fid_and_kid_match_independent_computations(features) -> None:
    real, other = features
    shifted = other + 0.5
    fid, kid, _ = fid_kid(real, shifted, kid_subsets=1, kid_subset_size=300)
    assert fid == pytest.approx(fid_scipy(real.numpy(), shifted.numpy()), rel=1e-6)
    assert kid == pytest.approx(kid_numpy(real.numpy(), shifted.numpy()), rel=1e-6)


def test_identical_sets_score_zero_and_shifted_sets_do_not(features) -> None:
    real, other = features
    fid_same, _, _ = fid_kid(real, real.clone(), kid_subsets=1, kid_subset_size=300)
    fid_shift, _, _ = fid_kid(real, real + 1.0, kid_subsets=1, kid_subset_size=300)
    assert abs(fid_same) < 1e-6 and fid_shift == pytest.approx(6.0, rel=1e-6)  # |shift|^2
    fid_other, _, _ = fid_kid(real, other)  # two samples of one distribution: small, > 0
    assert 0 < fid_other < fid_shift
    # KID on one full set against itself: the unbiased estimator gives
    # -2 (mean diag - mean off-diag) / m (the cross term keeps the diagonal), O(1/m): ~0.
    unit = torch.randn(1000, 6, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    _, kid_same, _ = fid_kid(unit, unit.clone(), kid_subsets=1, kid_subset_size=1000)
    _, kid_shift, _ = fid_kid(unit, unit + 1.0, kid_subsets=1, kid_subset_size=1000)
    assert kid_same == pytest.approx(kid_numpy(unit.numpy(), unit.numpy()), rel=1e-6)
    assert kid_shift > 0 and abs(kid_same) < 0.02 * kid_shift


def test_fid_kid_leave_the_global_rng_alone_and_refuse_bad_shapes(features) -> None:
    real, other = features
    state = torch.get_rng_state()
    fid_kid(real, other, kid_subsets=3, kid_subset_size=50)
    assert torch.equal(state, torch.get_rng_state())
    with pytest.raises(ValueError, match="dim"):
        fid_kid(real, other[:, :3])


def brute_force_pr(real: np.ndarray, fake: np.ndarray, k: int) -> tuple[float, float]:
    def radii(x: np.ndarray) -> list[float]:
        out = []
        for i in range(len(x)):
            d = sorted(float(np.linalg.norm(x[i] - x[j])) for j in range(len(x)) if j != i)
            out.append(d[k - 1])
        return out

    def covered(points: np.ndarray, centres: np.ndarray, r: list[float]) -> float:
        hits = [
            any(np.linalg.norm(p - c) <= rc for c, rc in zip(centres, r, strict=True))
            for p in points
        ]
        return float(np.mean(hits))

    return covered(fake, real, radii(real)), covered(real, fake, radii(fake))


def test_precision_recall_match_brute_force_loops() -> None:
    g = torch.Generator().manual_seed(1)
    real = torch.randn(40, 3, generator=g, dtype=torch.float64)
    fake = 0.7 * torch.randn(35, 3, generator=g, dtype=torch.float64) + 0.4
    expected = brute_force_pr(real.numpy(), fake.numpy(), k=3)
    assert precision_recall(real, fake, k=3) == pytest.approx(expected, abs=1e-12)


def test_precision_recall_limits() -> None:
    g = torch.Generator().manual_seed(2)
    real = torch.randn(60, 4, generator=g, dtype=torch.float64)
    assert precision_recall(real, real.clone(), k=3) == (1.0, 1.0)
    assert precision_recall(real, real + 100.0, k=3) == (0.0, 0.0)
    dropped = real[real[:, 0] > 0]  # mode dropping: precise, but half the real set is missed
    precision, recall = precision_recall(real, dropped, k=3)
    assert precision == 1.0 and recall < 0.8
    with pytest.raises(ValueError, match="k=60"):
        knn_radii(real, 60)


class _IntensityClassifier(nn.Module):
    """Class 1 for a bright half, class 0 for a dark one; confidence set by ``sharpness``."""

    def __init__(self, sharpness: float) -> None:
        super().__init__()
        self.sharpness = sharpness

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        score = (x.mean(dim=(1, 2, 3)) - 0.5) * self.sharpness
        return torch.stack([-score, score], dim=1)


def test_consistency_counts_agreeing_confident_halves() -> None:
    canvases = torch.zeros(4, 1, 32, 32)
    canvases[0] = 1.0  # bright | bright: agree
    canvases[1, ..., :16] = 1.0  # bright | dark: disagree
    canvases[3, ..., 16:] = 1.0  # dark | bright: disagree; canvas 2 dark | dark: agree
    assert consistency(_IntensityClassifier(100.0), canvases) == 0.5  # type: ignore[arg-type]
    # unconfident (p = sigmoid(2 * 0.5 * 1) = 0.73 < 0.9): nothing counts
    assert consistency(_IntensityClassifier(1.0), canvases) == 0.0  # type: ignore[arg-type]


def _canvases(left_bright: list[bool], right_bright: list[bool]) -> torch.Tensor:
    canvases = torch.zeros(len(left_bright), 1, 32, 32)
    for i, (lb, rb) in enumerate(zip(left_bright, right_bright, strict=True)):
        canvases[i, ..., :16] = float(lb)
        canvases[i, ..., 16:] = float(rb)
    return canvases


def test_kappa_matches_cohens_formula_and_sees_through_collapse() -> None:
    classifier = _IntensityClassifier(100.0)
    left = [True, True, True, False, False, False, True, False]
    right = [True, True, False, False, False, True, True, False]
    # by hand: p_o = 6/8; p_L(bright) = 4/8, p_R(bright) = 4/8, p_e = 0.5; kappa = 0.5
    assert agreement_kappa(classifier, _canvases(left, right)) == pytest.approx(0.5)  # type: ignore[arg-type]
    same = _canvases(left, left)
    assert agreement_kappa(classifier, same) == pytest.approx(1.0)  # type: ignore[arg-type]
    collapsed = _canvases([True] * 8, [True] * 8)  # one class everywhere: consistency 1, kappa 0
    assert consistency(classifier, collapsed) == 1.0  # type: ignore[arg-type]
    assert agreement_kappa(classifier, collapsed) == 0.0  # type: ignore[arg-type]
    rng = np.random.default_rng(0)  # independent halves: kappa about 0
    a, b = rng.random(4000) < 0.3, rng.random(4000) < 0.3
    assert abs(agreement_kappa(classifier, _canvases(list(a), list(b)))) < 0.05  # type: ignore[arg-type]
