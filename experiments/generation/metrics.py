"""Offline generation metrics in the features of the pipeline's own digit classifier.

* FID and KID: torchmetrics' ``FrechetInceptionDistance`` / ``KernelInceptionDistance`` with a
  custom feature extractor (``CanvasFeatures``; no Inception weights, nothing downloaded);
* k-NN precision and recall (Kynkäänniemi et al., NeurIPS 2019): a sample is "covered" when it
  lies inside the k-nearest-neighbour ball of some point of the other set;
* the consistency score: the share of canvases whose two halves get the same class, each with
  probability > ``threshold``;
* the agreement kappa: Cohen's kappa of the two halves' predicted classes, the agreement beyond
  what independent halves with the same class frequencies would reach. A generator collapsed
  onto one class scores consistency ~1 but kappa 0: the pilot gate reads kappa.

These numbers are *relative* measures for comparing the arms of one experiment: they live in a
128-dimensional feature space of a small digit classifier and are not comparable with ImageNet
FID / KID values (Inception features, 2048 dimensions).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from experiments.data.twin_digits import halves
from experiments.models.digit_classifier import HalfDigitClassifier


def _torchmetrics():  # lazy: torchmetrics is an extra of the experiments
    try:
        from torchmetrics.image.fid import FrechetInceptionDistance
        from torchmetrics.image.kid import KernelInceptionDistance
    except ImportError as err:
        raise ImportError(
            "the generation metrics need torchmetrics: pip install -e '.[experiments]'"
        ) from err
    return FrechetInceptionDistance, KernelInceptionDistance


class FeatureIdentity(nn.Module):
    """Passes precomputed features (B, dim) through, so torchmetrics computes FID / KID on
    features that were extracted once (``num_features`` is what torchmetrics reads)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.num_features = dim

    def forward(self, features: Tensor) -> Tensor:
        """(B, dim) -> the same tensor."""
        return features


def fid_kid(
    real: Tensor, fake: Tensor, *, kid_subsets: int = 50, kid_subset_size: int = 500, seed: int = 0
) -> tuple[float, float, float]:
    """FID, KID mean and KID std between two feature sets (N, dim) and (M, dim), by torchmetrics
    (FID in float64; KID: the unbiased MMD^2 with the cubic polynomial kernel over
    ``kid_subsets`` random subsets of ``min(kid_subset_size, N, M)`` samples, drawn from a
    generator seeded with ``seed``, torch's global RNG left untouched)."""
    if real.ndim != 2 or fake.ndim != 2 or real.shape[1] != fake.shape[1]:
        raise ValueError(
            f"fid_kid: feature sets must be (N, dim) and (M, dim), got {tuple(real.shape)} and "
            f"{tuple(fake.shape)}"
        )
    if min(len(real), len(fake)) < 2:
        raise ValueError("fid_kid: each feature set needs at least 2 samples")
    fid_cls, kid_cls = _torchmetrics()
    dim = real.shape[1]
    fid = fid_cls(feature=FeatureIdentity(dim), reset_real_features=True)
    fid.update(real.double(), real=True)
    fid.update(fake.double(), real=False)
    size = min(kid_subset_size, len(real), len(fake))
    with warnings.catch_warnings():  # "will save all extracted features": that is the intent
        warnings.filterwarnings("ignore", message=".*save all extracted features.*")
        kid = kid_cls(feature=FeatureIdentity(dim), subsets=kid_subsets, subset_size=size)
    kid.update(real.double(), real=True)
    kid.update(fake.double(), real=False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        kid_mean, kid_std = kid.compute()
    return float(fid.compute()), float(kid_mean), float(kid_std)


def knn_radii(features: Tensor, k: int) -> Tensor:
    """(N,) distance of each row of ``features`` (N, dim) to its k-th nearest *other* row."""
    if not 1 <= k < len(features):
        raise ValueError(
            f"knn_radii: k={k} must lie in [1, {len(features) - 1}] for N={len(features)}"
        )
    distances = torch.cdist(features, features)
    return distances.kthvalue(k + 1, dim=1).values  # the 1st smallest is the point itself (0)


def coverage(points: Tensor, centres: Tensor, radii: Tensor) -> Tensor:
    """(len(points),) bool: whether each point lies in some ball ``|x - centre_j| <= radius_j``."""
    return (torch.cdist(points, centres) <= radii.unsqueeze(0)).any(dim=1)


def precision_recall(real: Tensor, fake: Tensor, k: int = 3) -> tuple[float, float]:
    """Improved precision and recall (Kynkäänniemi et al. 2019) of ``fake`` against ``real``
    feature sets (N, dim), (M, dim): precision = share of fake samples inside the real
    manifold (the union of the real samples' k-NN balls), recall = share of real samples
    inside the fake manifold. Computed in float64."""
    real, fake = real.double(), fake.double()
    precision = coverage(fake, real, knn_radii(real, k)).double().mean()
    recall = coverage(real, fake, knn_radii(fake, k)).double().mean()
    return float(precision), float(recall)


@torch.no_grad()
def consistency(classifier: HalfDigitClassifier, canvases: Tensor, threshold: float = 0.9) -> float:
    """Share of canvases (N, 1, 32, 32) in [0, 1] whose halves get the same class, both with
    probability > ``threshold``."""
    left, right = halves(canvases)
    p_left, p_right = classifier(left).softmax(1), classifier(right).softmax(1)
    (conf_l, cls_l), (conf_r, cls_r) = p_left.max(1), p_right.max(1)
    agree = (cls_l == cls_r) & (conf_l > threshold) & (conf_r > threshold)
    return float(agree.double().mean())


@torch.no_grad()
def agreement_kappa(classifier: HalfDigitClassifier, canvases: Tensor) -> float:
    """Cohen's kappa of the halves' predicted classes over canvases (N, 1, 32, 32) in [0, 1]:
    (p_o - p_e) / (1 - p_e), p_o the share of canvases whose halves get the same class, p_e the
    same share for independent halves with the observed class frequencies of each side. 1 for
    perfect agreement beyond chance, 0 for independent halves and for a single class on both
    sides (p_e = 1, no agreement beyond chance can be measured)."""
    left, right = halves(canvases)
    cls_l, cls_r = classifier(left).argmax(1), classifier(right).argmax(1)
    classes = int(max(cls_l.max(), cls_r.max())) + 1
    p_l = torch.bincount(cls_l, minlength=classes).double() / len(cls_l)
    p_r = torch.bincount(cls_r, minlength=classes).double() / len(cls_r)
    observed = float((cls_l == cls_r).double().mean())
    expected = float((p_l * p_r).sum())
    return 0.0 if expected >= 1.0 - 1e-12 else (observed - expected) / (1.0 - expected)


@dataclass(frozen=True)
class GenerationMetrics:
    """The metrics of one sample set against the real reference set."""

    fid: float
    kid: float
    kid_std: float
    precision: float
    recall: float
    consistency: float
    kappa: float

    def as_dict(self, prefix: str = "") -> dict[str, float]:
        """{prefix + name: value}."""
        return {f"{prefix}{k}": v for k, v in self.__dict__.items()}
