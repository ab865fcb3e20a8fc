"""What one job of study v4 does: a replicate's backbone (the pretraining job), or a training
job trained by the engine and read into its row.

* ``pretrain_row``: the replicate's backbone (``OUT/pretrain/replicate<r>.pt``), pretrained on
  its own clean train scans (``experiments.studies.pretraining``), deterministic, cached.
* ``train_row``: ``run_training`` in the job's folder, then the final model on the replicate's
  test canvases (``Splits.test``, which neither training nor selection ever sees) and the val
  mIoU after every epoch (the job's ``metrics.jsonl``); the step checkpoints are pruned.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch
from hydra.utils import instantiate
from torch.utils.data import DataLoader

from experiments.config.groups import TrainConfig
from experiments.data.splits import Splits
from experiments.engine.checkpoint import sidecar
from experiments.engine.file_sinks import read_jsonl
from experiments.engine.run import run_training
from experiments.engine.task import evaluate
from experiments.studies.model_studies import configured_model, task_of
from experiments.studies.paper_v4.jobs import Job
from experiments.studies.paper_v4.plan import Plan
from experiments.studies.pretraining import PretrainConf, ensure_pretrained

STEP_FILE = re.compile(r"^step-(\d+)\.pt$")


def backbone_path(out_dir: Path, replicate: int) -> Path:
    """Where a replicate's pretrained backbone lives (absolute)."""
    return (out_dir / "pretrain" / f"replicate{replicate}.pt").resolve()


def pretrain_conf(plan: Plan, replicate: int) -> PretrainConf:
    """The replicate's pretraining: its own seed and its own train scans."""
    return PretrainConf(
        images=plan.pretrain_images,
        steps=plan.pretrain_steps,
        seed=replicate,
        scan_seed=plan.data_seed(replicate),
    )


def pretrain_row(job: Job, plan: Plan, out_dir: Path) -> dict[str, Any]:
    """Pretrain (or find) the job's replicate's backbone; its steps, val pixel accuracy, time."""
    artefact = ensure_pretrained(
        backbone_path(out_dir, job.replicate), pretrain_conf(plan, job.replicate)
    )
    return {
        "steps": plan.pretrain_steps,
        "val_pixel_acc": artefact["val_pixel_acc"],
        "train_s": artefact["seconds"],
    }


def build_splits(cfg: TrainConfig) -> Splits:
    """The job's data (train, val, test) from its data config."""
    splits = instantiate(cfg.data, _partial_=True)()
    if not isinstance(splits, Splits) or splits.test is None:
        raise ValueError(
            f"data config {cfg.data!r} gives no test split; the study needs data=digit_seg with "
            "scan_seed and test_size > 0 (conf/experiment/paper_v4.yaml)"
        )
    return splits


def test_metrics(cfg: TrainConfig, job_dir: Path, splits: Splits) -> dict[str, float]:
    """``test_miou``, ``test_pixel_acc``, ``test_loss`` of the job's final model."""
    model = configured_model(cfg, splits.task, job_dir / "checkpoint.pt")
    loader = DataLoader(splits.test, batch_size=cfg.batch_size, shuffle=False)  # type: ignore[arg-type]
    with torch.no_grad():
        metrics = evaluate(model, loader, task_of(splits.task), device=torch.device("cpu"))
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


def prune_checkpoints(job_dir: Path) -> None:
    """Delete every step checkpoint but the newest (which marks the job finished on resume)."""
    for _, path in checkpoint_steps(job_dir)[:-1]:
        path.unlink()
        sidecar(path).unlink(missing_ok=True)


def train_row(cfg: TrainConfig, job_dir: Path) -> dict[str, Any]:
    """Train ``cfg`` in ``job_dir`` and read its row: final val metrics, test metrics, val
    curve, train time (``fidelity``: study v3's gradient-fidelity column, empty here); then
    prune the step checkpoints."""
    results = run_training(cfg, job_dir)
    if results.get("status") != "ok":
        raise RuntimeError(f"run_training ended with status {results.get('status')!r}")
    metrics = results["metrics"]
    splits = build_splits(cfg)
    curve = val_curve(job_dir)
    row = {
        "steps": curve[-1][0] if curve else None,
        "val_miou": metrics["val/miou"],
        "val_pixel_acc": metrics["val/pixel_acc"],
        "val_loss": metrics["val/loss"],
        **test_metrics(cfg, job_dir, splits),
        "val_curve": curve,
        "fidelity": [],
        "train_s": results["train_time_s"],
    }
    prune_checkpoints(job_dir)
    return row
