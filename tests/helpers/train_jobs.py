"""Real ``python -m experiments.train`` subprocesses for the engine tests, and the parts of a
job's files that must agree between two runs (everything but timings)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

from experiments.engine.checkpoint import read_checkpoint

ROOT = Path(__file__).resolve().parents[2]


def train_command(job: Path, args: list[str], *extra: str) -> list[str]:
    """The command line of one training job in ``job``."""
    return [sys.executable, "-m", "experiments.train", *args, *extra, f"hydra.run.dir={job}"]


def train_env() -> dict[str, str]:
    """Offline wandb, full Hydra errors, one thread."""
    return {**os.environ, "WANDB_MODE": "offline", "HYDRA_FULL_ERROR": "1", "OMP_NUM_THREADS": "1"}


def run_train(
    job: Path, args: list[str], *extra: str, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """Run the job to its end (bounded by ``timeout`` seconds)."""
    return subprocess.run(train_command(job, args, *extra), cwd=ROOT, env=train_env(),
                          capture_output=True, text=True, timeout=timeout, check=False)  # fmt: skip


def untimed(value: Any) -> Any:
    """``value`` without its time / seconds entries (nested dicts included)."""
    if isinstance(value, dict):
        return {k: untimed(v) for k, v in value.items() if "time" not in k and "seconds" not in k}
    return value


def job_results(job: Path) -> dict[str, Any]:
    """The comparable part of a finished job's ``results.json``."""
    results = json.loads((job / "results.json").read_text())
    assert results["status"] == "ok", results.get("error")
    return {k: untimed(results[k]) for k in ("metrics", "best", "failures", "solver")}


def metric_rows(job: Path) -> list[dict[str, Any]]:
    """The job's ``metrics.jsonl`` rows without timings."""
    return [untimed(json.loads(line)) for line in (job / "metrics.jsonl").read_text().splitlines()]


def job_parameters(job: Path) -> dict[str, torch.Tensor]:
    """The model state of the job's final checkpoint."""
    return read_checkpoint(job / "checkpoint.pt")["model"]
