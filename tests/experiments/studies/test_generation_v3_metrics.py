"""Generation v3's sample metrics against independent references: the Fréchet distance of two
Gaussians against the closed form (commuting covariances) and scipy's matrix square root, KID
against a direct double loop, kappa against scikit-learn, precision / recall on a constructed
example, the cell classifier's determinism and held-out accuracy, and the sample metrics of an
oracle (the real-data row) and of a constant prediction (kappa 0)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import linalg
from sklearn.metrics import cohen_kappa_score

from experiments.data.far_twins import FarTwinsDataset, right_cell
from experiments.studies.generation_v3.classifier import (
    ClassifierSettings,
    cached_classifier,
    train_classifier,
)
from experiments.studies.generation_v3.metrics import (
    cohen_kappa,
    fid,
    frechet_distance,
    kid,
    precision_recall,
)
from experiments.studies.generation_v3.samples import feature_sets, left_cell, sample_metrics


def test_frechet_distance_of_commuting_gaussians_is_the_closed_form() -> None:
    g = torch.Generator().manual_seed(0)
    mu_a, mu_b = torch.randn(5, generator=g).double(), torch.randn(5, generator=g).double()
    var_a = torch.rand(5, generator=g).double() + 0.1
    var_b = torch.rand(5, generator=g).double() + 0.1
    q, _ = torch.linalg.qr(torch.randn(5, 5, generator=g, dtype=torch.float64))
    cov_a, cov_b = q @ torch.diag(var_a) @ q.T, q @ torch.diag(var_b) @ q.T
    closed = float((mu_a - mu_b).pow(2).sum() + (var_a.sqrt() - var_b.sqrt()).pow(2).sum())
    assert frechet_distance(mu_a, cov_a, mu_b, cov_b) == pytest.approx(closed, rel=1e-9)


def test_fid_of_samples_is_scipys_formula() -> None:
    rng = np.random.default_rng(1)
    a = rng.normal(size=(200, 4)) @ rng.normal(size=(4, 4))
    b = rng.normal(size=(150, 4)) @ rng.normal(size=(4, 4)) + 0.5
    ca, cb = np.cov(a, rowvar=False), np.cov(b, rowvar=False)
    root = linalg.sqrtm(ca @ cb).real
    expected = ((a.mean(0) - b.mean(0)) ** 2).sum() + np.trace(ca + cb - 2 * root)
    assert fid(torch.from_numpy(a), torch.from_numpy(b)) == pytest.approx(expected, rel=1e-7)
    assert fid(torch.from_numpy(a), torch.from_numpy(a)) == pytest.approx(0.0, abs=1e-8)


def test_kid_is_the_unbiased_mmd_of_a_double_loop() -> None:
    rng = np.random.default_rng(2)
    a, b = rng.normal(size=(7, 3)), rng.normal(size=(5, 3)) + 0.3

    def k(x: np.ndarray, y: np.ndarray) -> float:
        return (float(x @ y) / 3 + 1) ** 3

    aa = sum(k(a[i], a[j]) for i in range(7) for j in range(7) if i != j) / (7 * 6)
    bb = sum(k(b[i], b[j]) for i in range(5) for j in range(5) if i != j) / (5 * 4)
    ab = sum(k(a[i], b[j]) for i in range(7) for j in range(5)) / (7 * 5)
    assert kid(torch.from_numpy(a), torch.from_numpy(b)) == pytest.approx(aa + bb - 2 * ab)


def test_kappa_is_scikit_learns() -> None:
    rng = np.random.default_rng(3)
    a = rng.integers(0, 10, size=300)
    b = np.where(rng.random(300) < 0.6, a, rng.integers(0, 10, size=300))
    ours = cohen_kappa(torch.from_numpy(a), torch.from_numpy(b))
    assert ours == pytest.approx(cohen_kappa_score(a, b), rel=1e-12)
    assert cohen_kappa(torch.from_numpy(a), torch.from_numpy(a)) == pytest.approx(1.0)
    same = torch.full((4,), 3)
    assert cohen_kappa(same, same) == 0.0  # p_e = 1: nothing beyond chance (sklearn: nan)


def test_precision_recall_on_a_constructed_example() -> None:
    # real: 4 points on a line at 0, 1, 2, 3 -> each 1-NN radius is 1 (k = 1)
    real = torch.tensor([[0.0], [1.0], [2.0], [3.0]])
    # fake: 0.5 and 3.9 lie inside real balls, 10 does not; fake radii (k=1): 3.4, 3.4, 6.1
    fake = torch.tensor([[0.5], [3.9], [10.0]])
    precision, recall = precision_recall(real, fake, k=1)
    assert precision == pytest.approx(2 / 3)
    # real points within 3.4 of 0.5 (0, 1, 2, 3) or 3.4 of 3.9 (1, 2, 3): all 4
    assert recall == 1.0
    far = torch.tensor([[100.0], [100.5], [101.0]])  # radii 0.5, 0.5, 0.5: covers no real point
    assert precision_recall(real, far, k=1) == (0.0, 0.0)


def test_the_cell_classifier_is_deterministic_accurate_and_cached(tmp_path) -> None:
    settings = ClassifierSettings(epochs=15)
    threads = torch.get_num_threads()
    first, record = train_classifier(settings, data_seed=1)
    second, again = train_classifier(settings, data_seed=1)
    assert torch.get_num_threads() == threads
    for p, q in zip(first.state_dict().values(), second.state_dict().values(), strict=True):
        assert torch.equal(p, q)
    assert record["val_accuracy"] == again["val_accuracy"] > 0.9
    cached, stored = cached_classifier(tmp_path, 1, settings)
    assert list(tmp_path.iterdir())  # written
    loaded, read = cached_classifier(tmp_path, 1, settings)
    assert read["val_accuracy"] == stored["val_accuracy"]
    for p, q in zip(cached.state_dict().values(), loaded.state_dict().values(), strict=True):
        assert torch.equal(p, q)
    assert math.isfinite(read["train_time_s"])


class _Oracle(torch.nn.Module):
    """Returns the true canvases, in the order the metrics feed the masked ones."""

    def __init__(self, canvases: torch.Tensor) -> None:
        super().__init__()
        self.canvases, self.at = canvases, 0

    def forward(self, masked: torch.Tensor) -> torch.Tensor:
        out = self.canvases[self.at : self.at + len(masked)]
        self.at += len(masked)
        return out


class _CopyLeft(torch.nn.Module):
    """Predicts the right cell as a copy of the left digit."""

    def forward(self, masked: torch.Tensor) -> torch.Tensor:
        out = masked.clone()
        out[:, 0, 8:16, 24:32] = masked[:, 0, 8:16, 0:8]
        return out


class _Constant(torch.nn.Module):
    def __init__(self, cell: torch.Tensor) -> None:
        super().__init__()
        self.cell = cell

    def forward(self, masked: torch.Tensor) -> torch.Tensor:
        out = masked.clone()
        out[:, 0, 8:16, 24:32] = self.cell
        return out


def test_an_oracle_scores_the_real_row_and_a_constant_scores_kappa_zero() -> None:
    val = FarTwinsDataset("val", 300, seed=2)
    classifier, _ = train_classifier(ClassifierSettings(epochs=15), data_seed=2)
    oracle = sample_metrics(_Oracle(val.canvases), classifier, val)
    classes = ("consistency", "kappa")
    assert {k: oracle["model"][k] for k in classes} == {k: oracle["real"][k] for k in classes}
    assert oracle["real"]["kappa"] == 1.0 and oracle["real"]["consistency"] > 0.8
    # the reference's samples are the even left scans' own cells: copying the left digit
    # reproduces its feature metrics exactly, and every copy has its twin's class
    copy = sample_metrics(_CopyLeft(), classifier, val)["model"]
    features = ("fid", "kid", "precision", "recall")
    assert {k: copy[k] for k in features} == {k: oracle["real"][k] for k in features}
    assert copy["consistency"] == 1.0
    chosen, even, odd = feature_sets(val)
    assert len(set(val.pairs[chosen.numpy(), 0])) == len(chosen) == len(even)  # no repeats
    assert (val.pairs[chosen.numpy(), 0] % 2 == 0).all() and len(odd) == len(val.digit_indices) // 2
    constant = sample_metrics(_Constant(right_cell(val.canvases)[0]), classifier, val)["model"]
    assert constant["kappa"] == pytest.approx(0.0, abs=1e-12)
    labels = classifier(left_cell(val.canvases)).argmax(1)
    share = float((labels == classifier(right_cell(val.canvases)[:1]).argmax(1)).double().mean())
    assert constant["consistency"] == pytest.approx(share)
    assert constant["fid"] > oracle["real"]["fid"] and constant["recall"] < oracle["real"]["recall"]
