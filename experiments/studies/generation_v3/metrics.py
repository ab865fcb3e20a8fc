"""Sample metrics in a classifier's feature space: FID, KID, k-NN precision / recall, Cohen's
kappa. Everything in float64; no feature extractor here (``samples`` extracts the features).

* FID: the Fréchet distance of two Gaussians fitted to the feature sets,
  ``|mu_a - mu_b|^2 + tr(S_a + S_b - 2 (S_a S_b)^(1/2))``;
* KID: the unbiased estimate of the squared MMD with the cubic polynomial kernel
  ``k(x, y) = (x.y / d + 1)^3`` (Binkowski et al. 2018), on the whole sets (no subsets);
* precision / recall: Kynkäänniemi et al. 2019, a sample is covered when it lies inside the
  k-nearest-neighbour ball of some sample of the other set;
* Cohen's kappa of two label vectors: agreement beyond what independent labels with the same
  class frequencies reach.

These are relative measures between arms of one study: a small digit classifier's features, not
Inception's, so not comparable with published FID / KID values.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _check_pair(name: str, a: Tensor, b: Tensor, minimum: int = 2) -> None:
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1]:
        raise ValueError(f"{name}: feature sets must be (N, dim) and (M, dim), got "
                         f"{tuple(a.shape)} and {tuple(b.shape)}")  # fmt: skip
    if min(len(a), len(b)) < minimum:
        raise ValueError(f"{name}: each feature set needs >= {minimum} samples, got "
                         f"{len(a)} and {len(b)}")  # fmt: skip


def frechet_distance(mu_a: Tensor, cov_a: Tensor, mu_b: Tensor, cov_b: Tensor) -> float:
    """Fréchet distance of N(mu_a, cov_a) and N(mu_b, cov_b): means (d,), covariances (d, d).
    ``tr((S_a S_b)^(1/2))`` is the sum of the square roots of the eigenvalues of the symmetric
    ``S_a^(1/2) S_b S_a^(1/2)`` (negative round-off eigenvalues clipped to 0)."""
    mu_a, mu_b, cov_a, cov_b = (t.double() for t in (mu_a, mu_b, cov_a, cov_b))
    values, vectors = torch.linalg.eigh(cov_a)
    root_a = (vectors * values.clamp(min=0).sqrt()) @ vectors.T
    middle = root_a @ cov_b @ root_a
    cross = torch.linalg.eigvalsh((middle + middle.T) / 2).clamp(min=0).sqrt().sum()
    mean_term = (mu_a - mu_b).pow(2).sum()
    return float(mean_term + torch.trace(cov_a) + torch.trace(cov_b) - 2 * cross)


def fid(a: Tensor, b: Tensor) -> float:
    """FID of feature sets a (N, d) and b (M, d) (sample means and unbiased covariances)."""
    _check_pair("fid", a, b)
    a, b = a.double(), b.double()
    return frechet_distance(a.mean(0), torch.cov(a.T), b.mean(0), torch.cov(b.T))


def polynomial_kernel(x: Tensor, y: Tensor) -> Tensor:
    """KID's kernel ``(x.y / d + 1)^3``: x (N, d), y (M, d) -> (N, M)."""
    return (x @ y.T / x.shape[1] + 1).pow(3)


def kid(a: Tensor, b: Tensor) -> float:
    """Unbiased squared MMD of feature sets a (N, d), b (M, d) with ``polynomial_kernel``:
    mean of k(a_i, a_j) over i != j + the same for b - 2 mean of k(a_i, b_j)."""
    _check_pair("kid", a, b)
    a, b = a.double(), b.double()
    n, m = len(a), len(b)
    kaa, kbb = polynomial_kernel(a, a), polynomial_kernel(b, b)
    within_a = (kaa.sum() - kaa.diagonal().sum()) / (n * (n - 1))
    within_b = (kbb.sum() - kbb.diagonal().sum()) / (m * (m - 1))
    return float(within_a + within_b - 2 * polynomial_kernel(a, b).mean())


def knn_radii(features: Tensor, k: int) -> Tensor:
    """(N,) distance of each row of ``features`` (N, d) to its k-th nearest *other* row."""
    if not 1 <= k < len(features):
        raise ValueError(f"knn_radii: k={k} must lie in [1, {len(features) - 1}] for "
                         f"N={len(features)}")  # fmt: skip
    return torch.cdist(features, features).kthvalue(k + 1, dim=1).values  # 1st: itself (0)


def _covered(points: Tensor, centres: Tensor, radii: Tensor) -> Tensor:
    """(len(points),) bool: whether each point lies in some ball |x - centre_j| <= radius_j."""
    return (torch.cdist(points, centres) <= radii.unsqueeze(0)).any(dim=1)


def precision_recall(real: Tensor, fake: Tensor, k: int = 3) -> tuple[float, float]:
    """Precision (share of ``fake`` (M, d) inside the union of ``real``'s (N, d) k-NN balls) and
    recall (share of ``real`` inside ``fake``'s), Kynkäänniemi et al. 2019."""
    _check_pair("precision_recall", real, fake, minimum=k + 1)
    real, fake = real.double(), fake.double()
    precision = _covered(fake, real, knn_radii(real, k)).double().mean()
    recall = _covered(real, fake, knn_radii(fake, k)).double().mean()
    return float(precision), float(recall)


def cohen_kappa(a: Tensor, b: Tensor) -> float:
    """Cohen's kappa of two integer label vectors (N,): ``(p_o - p_e) / (1 - p_e)``, p_o the
    share of equal labels, p_e the same share for independent labels with each vector's class
    frequencies. When both vectors hold one and the same class (p_e = 1) it is 1 if they agree
    everywhere (they do) and no agreement beyond chance can be measured: returns 0.0 then, as
    for independent labels (scikit-learn returns nan)."""
    if a.shape != b.shape or a.ndim != 1 or len(a) == 0:
        raise ValueError(f"cohen_kappa: need two label vectors (N,) of one length N >= 1, got "
                         f"{tuple(a.shape)} and {tuple(b.shape)}")  # fmt: skip
    classes = int(max(a.max(), b.max())) + 1
    p_a = torch.bincount(a, minlength=classes).double() / len(a)
    p_b = torch.bincount(b, minlength=classes).double() / len(b)
    observed = float((a == b).double().mean())
    expected = float((p_a * p_b).sum())
    return 0.0 if expected >= 1.0 - 1e-12 else (observed - expected) / (1.0 - expected)
