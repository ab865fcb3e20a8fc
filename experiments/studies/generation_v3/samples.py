"""Sample metrics of a trained masked-cell model on its held-out canvases, and the real-data row.

The model's "sample" of a canvas is its output for the masked (right) cell, clipped to the pixel
range [0, 1]: a regression mean (the conditional mean of the right digit given the canvas), not
a draw from a distribution, so it is blurrier than any real digit. Each predicted cell is read
by the digit classifier of the job's data seed (``classifier.cached_classifier``):

* pair consistency: share of canvases whose predicted cell gets the classifier's class of the
  visible (left) twin;
* kappa: Cohen's kappa between the predicted cell's class and the classifier's class of the true
  masked cell (so the real-data row has kappa 1 by construction);
* FID / KID and precision / recall (k = 3) in the classifier's features, against real held-out
  cells, with no scan repeated (``feature_sets``): the val scans are split by index parity;
  the model's predictions for one held-out canvas per even left scan are compared with the
  cells of the odd scans; the real-data row compares the even scans' own cells (the same
  scans) with the odd ones (the floor each metric has at these sample sizes).

Pair consistency and kappa are computed over all held-out canvases (a scan can be in several).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from hydra.utils import instantiate
from torch import Tensor, nn

from experiments.config.groups import TrainConfig
from experiments.data.digits import load_digits_arrays
from experiments.data.far_twins import (
    DIGIT,
    LEFT,
    TOP,
    FarTwinsDataset,
    digit_tensor,
    mask_right_cell,
    right_cell,
)
from experiments.engine.build import build_context, build_datasets, build_model, context_channels
from experiments.studies.generation_v3.classifier import CellClassifier, cached_classifier
from experiments.studies.generation_v3.metrics import cohen_kappa, fid, kid, precision_recall

K = 3  # neighbours of precision / recall
BATCH = 256


def left_cell(canvases: Tensor) -> Tensor:
    """Canvases (N, 1, 32, 32) -> the left digit's cells (N, 8, 8)."""
    return canvases[:, 0, TOP : TOP + DIGIT, LEFT : LEFT + DIGIT]


@torch.no_grad()
def predicted_cells(model: nn.Module, canvases: Tensor) -> Tensor:
    """The model's right cells (N, 8, 8) for canvases (N, 1, 32, 32) with that cell masked,
    clipped to [0, 1] (eval mode, batches of ``BATCH``)."""
    model.eval()
    out = [right_cell(model(mask_right_cell(c))) for c in canvases.split(BATCH)]
    return torch.cat(out).clamp(0.0, 1.0)


def feature_sets(val: FarTwinsDataset) -> tuple[Tensor, Tensor, Tensor]:
    """Which cells the feature metrics compare, without repeated scans (a repeated scan would
    shrink the k-NN radii to 0): the val scans split by index parity into even and odd ones.
    Returns (``chosen``: one held-out canvas per even left scan, indices into ``val``;
    ``even``: those left scans' cells (M, 8, 8), the reference's samples; ``odd``: the cells
    of every odd val scan (N, 8, 8), the real set). The model's samples are its predictions for
    the ``chosen`` canvases (a prediction depends on the left digit alone: one per scan)."""
    images, _ = load_digits_arrays()
    scans = digit_tensor(images[val.digit_indices])
    left = val.pairs[:, 0]
    _, first = np.unique(left, return_index=True)
    chosen = np.sort(first[left[first] % 2 == 0])
    return torch.from_numpy(chosen), scans[left[chosen]], scans[1::2]


def _features_scores(classifier: CellClassifier, fake: Tensor, real: Tensor) -> dict[str, float]:
    with torch.no_grad():
        classifier.eval()
        fake_f, real_f = classifier.features(fake), classifier.features(real)
    precision, recall = precision_recall(real_f, fake_f, K)
    return {"fid": fid(fake_f, real_f), "kid": kid(fake_f, real_f), "precision": precision,
            "recall": recall}  # fmt: skip


@torch.no_grad()
def _class_scores(
    classifier: CellClassifier, cells: Tensor, true_cells: Tensor, left: Tensor
) -> dict[str, float]:
    classifier.eval()
    own, true = classifier(cells).argmax(1), classifier(true_cells).argmax(1)
    twin = classifier(left).argmax(1)
    return {"consistency": float((own == twin).double().mean()), "kappa": cohen_kappa(own, true)}


def sample_metrics(
    model: nn.Module, classifier: CellClassifier, val: FarTwinsDataset
) -> dict[str, dict[str, float]]:
    """``{"model": ..., "real": ...}``: the metrics (module docstring) of ``model``'s predicted
    cells and of the true cells of the held-out canvases ``val``."""
    chosen, even, odd = feature_sets(val)
    if min(len(chosen), len(odd)) <= K:
        raise ValueError(f"sample_metrics: {len(chosen)} distinct even left scans and {len(odd)} "
                         f"odd scans in {len(val)} held-out canvases; each needs > {K}; use a "
                         "larger val_size")  # fmt: skip
    canvases = val.canvases
    true_cells, left = right_cell(canvases), left_cell(canvases)
    predicted = predicted_cells(model, canvases)
    return {
        "model": _class_scores(classifier, predicted, true_cells, left)
        | _features_scores(classifier, predicted[chosen], odd),
        "real": _class_scores(classifier, true_cells, true_cells, left)
        | _features_scores(classifier, even, odd),
    }


def held_out(cfg: TrainConfig) -> FarTwinsDataset:
    """The job's held-out canvases (with their pairs), as ``far_twins_masked`` builds them."""
    data: Mapping[str, Any] = instantiate(cfg.data, _partial_=True).keywords
    return FarTwinsDataset("val", int(data.get("val_size", 1024)),
                           val_fraction=float(data.get("val_fraction", 0.2)),
                           seed=int(data.get("seed", 0)))  # fmt: skip


def checkpoint_model(cfg: TrainConfig, checkpoint: Path) -> nn.Module:
    """The job's network as ``run_training`` builds it, with the weights of ``checkpoint``."""
    _, _, info = build_datasets(cfg.data)
    solver, adjoint = instantiate(cfg.solver), instantiate(cfg.adjoint)
    context = build_context(cfg.context, context_channels(info, cfg.model), solver, adjoint)
    model = build_model(info, context, cfg.model, solver, adjoint)
    state = torch.load(checkpoint, map_location="cpu", weights_only=False)
    model.load_state_dict(state["model"])
    return model.eval()


def job_samples(cfg: TrainConfig, job_dir: Path, classifiers: Path) -> dict[str, Any]:
    """The sample metrics of the job in ``job_dir`` (its final ``checkpoint.pt``), with the
    classifier (cached in ``classifiers``) of its data seed: the row's new keys
    ``samples`` (the model's), ``samples_real`` (the real-data row of that seed) and
    ``classifier`` (the classifier's val accuracy and key)."""
    val = held_out(cfg)
    classifier, record = cached_classifier(classifiers, val.seed)
    scores = sample_metrics(checkpoint_model(cfg, job_dir / "checkpoint.pt"), classifier, val)
    kept = {key: record[key] for key in ("val_accuracy", "data_seed", "settings")}
    return {"samples": scores["model"], "samples_real": scores["real"], "classifier": kept}
