"""What the paper-regime study v3 reads off a finished training job: the test metrics, the val
curve and the gradient fidelity along training.

* ``test_metrics``: the final model (``checkpoint.pt``) on the replicate's test canvases
  (``Splits.test``), which neither training nor selection ever sees.
* ``val_curve``: validation mIoU after every epoch (the job's ``metrics.jsonl``).
* ``fidelity_curve``: at every epoch-end checkpoint (``checkpoints/step-*.pt``), the cosine of
  the task-loss gradient the arm trains with to the BPTT gradient at the same weights and K
  (``experiments.studies.task_gradients.task_loss_gradient``: d loss / dX at the ham's input,
  the gradient through which the lower bread and the backbone are trained; the parameters above
  the ham get the same gradient under every mode), on a fixed batch of the first
  ``FIDELITY_BATCH`` training canvases, eval mode, identical initial bases for both modes.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
from hydra.utils import instantiate
from torch import nn
from torch.utils.data import DataLoader

from experiments.config.groups import TrainConfig
from experiments.data.splits import Splits
from experiments.engine.build import build_context, build_model, context_channels
from experiments.engine.checkpoint import read_checkpoint, sidecar
from experiments.engine.file_sinks import read_jsonl
from experiments.engine.task import Task, evaluate
from experiments.studies.task_gradients import task_loss_gradient
from implicit_ham.adjoints.modes import OneStep, Unroll
from implicit_ham.decompositions.base import Decomposition

FIDELITY_BATCH = 16
STEP_FILE = re.compile(r"^step-(\d+)\.pt$")


def build_splits(cfg: TrainConfig) -> Splits:
    """The job's data (train, val, test) from its data config."""
    splits = instantiate(cfg.data, _partial_=True)()
    if not isinstance(splits, Splits) or splits.test is None:
        raise ValueError(
            f"data config {cfg.data!r} gives no test split; the study needs data=digit_seg with "
            "scan_seed and test_size > 0 (conf/experiment/paper_v3.yaml)"
        )
    return splits


def build_job_model(cfg: TrainConfig, splits: Splits) -> nn.Module:
    """The job's network as ``run_training`` builds it (before any weights are loaded)."""
    solver, adjoint = instantiate(cfg.solver), instantiate(cfg.adjoint)
    channels = context_channels(splits.task, cfg.model)
    return build_model(
        splits.task, build_context(cfg.context, channels, solver, adjoint), cfg.model
    )


def _task(splits: Splits) -> Task:
    info = splits.task
    return Task(
        info.kind, info.num_classes, -100 if info.ignore_index is None else info.ignore_index
    )


def test_metrics(cfg: TrainConfig, job_dir: Path, splits: Splits) -> dict[str, float]:
    """``test_miou``, ``test_pixel_acc``, ``test_loss`` of the job's final model."""
    model = build_job_model(cfg, splits)
    model.load_state_dict(read_checkpoint(job_dir / "checkpoint.pt")["model"])
    loader = DataLoader(splits.test, batch_size=cfg.batch_size, shuffle=False)  # type: ignore[arg-type]
    with torch.no_grad():
        metrics = evaluate(model, loader, _task(splits), device=torch.device("cpu"))
    return {
        "test_miou": metrics["val/miou"],
        "test_pixel_acc": metrics["val/pixel_acc"],
        "test_loss": metrics["val/loss"],
    }


def val_curve(job_dir: Path) -> list[tuple[int, float]]:
    """[(step, val mIoU)] after every epoch, from the job's ``metrics.jsonl``."""
    rows = read_jsonl(job_dir / "metrics.jsonl")
    return [(int(r["step"]), float(r["val/miou"])) for r in rows if "val/miou" in r]


def checkpoint_steps(job_dir: Path) -> list[tuple[int, Path]]:
    """The job's step checkpoints, oldest first."""
    found = []
    for path in (job_dir / "checkpoints").glob("step-*.pt"):
        match = STEP_FILE.match(path.name)
        if match:
            found.append((int(match.group(1)), path))
    return sorted(found)


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    denominator = float(a.norm() * b.norm())
    return float((a * b).sum()) / denominator if denominator > 0 else float("nan")


def fidelity_curve(
    cfg: TrainConfig, job_dir: Path, splits: Splits, through_bases: bool
) -> list[tuple[int, float]]:
    """[(step, cosine of the arm's one-step gradient to BPTT's)] at every step checkpoint."""
    model = build_job_model(cfg, splits)
    hams = [m for m in model.modules() if isinstance(m, Decomposition)]
    if len(hams) != 1:
        raise ValueError(f"fidelity_curve: expected one ham in the model, found {len(hams)}")
    ham = hams[0]
    images, masks = (t[:FIDELITY_BATCH] for t in splits.train.tensors)  # type: ignore[attr-defined]
    task, k = _task(splits), cfg.context.steps  # type: ignore[attr-defined]
    curve = []
    for step, path in checkpoint_steps(job_dir):
        model.load_state_dict(read_checkpoint(path)["model"])
        used = task_loss_gradient(model, ham, images, masks, task, adjoint=OneStep(),
                                  through_bases=through_bases, steps=k)  # fmt: skip
        bptt = task_loss_gradient(model, ham, images, masks, task, adjoint=Unroll(),
                                  through_bases=False, steps=k)  # fmt: skip
        curve.append((step, _cosine(used, bptt)))
    return curve


def prune_checkpoints(job_dir: Path) -> None:
    """Delete every step checkpoint but the newest (which marks the job finished on resume)."""
    for _, path in checkpoint_steps(job_dir)[:-1]:
        path.unlink()
        sidecar(path).unlink(missing_ok=True)
