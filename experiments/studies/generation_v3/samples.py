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
  right cells. The held-out canvases are split in two by their right digit's scan (even / odd
  index among the val scans, so no scan is in both halves): the predictions of half A are
  compared with the real cells of half B; the real-data row compares the real cells of A with
  those of B (the floor each metric has at these sample sizes).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from hydra.utils import instantiate
from torch import Tensor, nn

from experiments.config.groups import TrainConfig
from experiments.data.far_twins import (
    DIGIT,
    LEFT,
    TOP,
    FarTwinsDataset,
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


def _scores(
    classifier: CellClassifier, cells: Tensor, true_cells: Tensor, left: Tensor, half: Tensor
) -> dict[str, float]:
    """The metrics of ``cells`` (N, 8, 8): classes against the left twins' and the true cells',
    features of half A (``~half``) against the true cells' of half B (``half``)."""
    with torch.no_grad():
        classifier.eval()
        own, true = classifier(cells).argmax(1), classifier(true_cells).argmax(1)
        twin = classifier(left).argmax(1)
        fake, real = classifier.features(cells[~half]), classifier.features(true_cells[half])
    precision, recall = precision_recall(real, fake, K)
    return {
        "consistency": float((own == twin).double().mean()),
        "kappa": cohen_kappa(own, true),
        "fid": fid(fake, real),
        "kid": kid(fake, real),
        "precision": precision,
        "recall": recall,
    }


def sample_metrics(
    model: nn.Module, classifier: CellClassifier, val: FarTwinsDataset
) -> dict[str, dict[str, float]]:
    """``{"model": ..., "real": ...}``: the metrics (module docstring) of ``model``'s predicted
    cells and of the true cells of the held-out canvases ``val``."""
    canvases = val.canvases
    half = torch.from_numpy(val.pairs[:, 1] % 2 == 1)
    if int(half.sum()) <= K or int((~half).sum()) <= K:
        raise ValueError(f"sample_metrics: {len(canvases)} held-out canvases split into "
                         f"{int((~half).sum())} / {int(half.sum())}; each half needs > {K}; "
                         "use a larger val_size")  # fmt: skip
    true_cells, left = right_cell(canvases), left_cell(canvases)
    predicted = predicted_cells(model, canvases)
    return {
        "model": _scores(classifier, predicted, true_cells, left, half),
        "real": _scores(classifier, true_cells, true_cells, left, half),
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
