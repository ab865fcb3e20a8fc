"""Sampling from a generator and scoring the samples against the real reference canvases.

Sampling runs inside ``torch.random.fork_rng`` with a fixed seed: the latents (and a Hamburger's
random initial bases) are the same at every evaluation, and torch's global RNG, which training
draws from, is left exactly as it was (so evaluations never change a run's training, and a
resumed run stays identical to an uninterrupted one).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from experiments.data.twin_digits import from_gan_range
from experiments.generation.metrics import (
    GenerationMetrics,
    agreement_kappa,
    consistency,
    fid_kid,
    precision_recall,
)
from experiments.generation.nets import LocalGenerator
from experiments.models.digit_classifier import CanvasFeatures
from experiments.models.gan import Generator

SAMPLE_SEED = 12345
CHUNK = 250


@torch.no_grad()
def sample_canvases(
    generator: Generator | LocalGenerator, count: int, seed: int = SAMPLE_SEED
) -> Tensor:
    """``count`` canvases (count, 1, 32, 32) in [0, 1] from ``generator`` in eval mode, with
    latents and any other randomness seeded by ``seed`` (torch's global RNG restored after)."""
    was_training = generator.training
    generator.eval()
    device = next(generator.parameters()).device
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        chunks = [generator.sample(min(CHUNK, count - start)) for start in range(0, count, CHUNK)]
    generator.train(was_training)
    return from_gan_range(torch.cat(chunks).float().cpu())


@torch.no_grad()
def features_of(extractor: CanvasFeatures, canvases: Tensor) -> Tensor:
    """Features (N, 128) of canvases (N, 1, 32, 32) in [0, 1], in chunks."""
    return torch.cat([extractor(canvases[i : i + CHUNK]) for i in range(0, len(canvases), CHUNK)])


def score(
    canvases: Tensor,
    real_features: Tensor,
    extractor: CanvasFeatures,
    *,
    knn_k: int,
    kid_subsets: int,
    kid_subset_size: int,
) -> GenerationMetrics:
    """All metrics of ``canvases`` (N, 1, 32, 32) in [0, 1] against the real features."""
    fake_features = features_of(extractor, canvases)
    fid, kid, kid_std = fid_kid(
        real_features, fake_features, kid_subsets=kid_subsets, kid_subset_size=kid_subset_size
    )
    precision, recall = precision_recall(real_features, fake_features, k=knn_k)
    return GenerationMetrics(
        fid=fid,
        kid=kid,
        kid_std=kid_std,
        precision=precision,
        recall=recall,
        consistency=consistency(extractor.classifier, canvases),
        kappa=agreement_kappa(extractor.classifier, canvases),
    )


def save_grid(canvases: Tensor | np.ndarray, path: str | Path, columns: int = 8) -> Path:
    """The first ``columns**2`` canvases (N, 1, 32, 32) in [0, 1] as a PNG grid (2-pixel gaps)."""
    from PIL import Image

    count = min(columns * columns, len(canvases))
    rows = -(-count // columns)
    gap, size = 2, canvases.shape[-1]
    grid = np.ones((rows * (size + gap) + gap, columns * (size + gap) + gap), dtype=np.float32)
    for i in range(count):
        r, c = divmod(i, columns)
        top, left = gap + r * (size + gap), gap + c * (size + gap)
        grid[top : top + size, left : left + size] = np.asarray(canvases[i, 0])
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray((grid * 255).round().astype(np.uint8), mode="L").save(path)
    return path
