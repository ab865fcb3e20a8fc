"""Real ``python -m experiments.train`` subprocesses for the engine tests, the parts of a
job's files that must agree between two runs (everything but timings), and the agreement of a
job's failure log with its ``results.json``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
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


def start_train(job: Path, args: list[str], *extra: str) -> subprocess.Popen[str]:
    """Start the job without waiting; stdout and stderr merged into ``proc.stdout``."""
    command = train_command(job, args, *extra)
    return subprocess.Popen(command, cwd=ROOT, env=train_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # fmt: skip


def wait_for(proc: subprocess.Popen[str], ready: Callable[[], bool], timeout: float = 600) -> None:
    """Poll ``ready()`` every 2 ms while ``proc`` runs; AssertionError when the process ends
    first or ``timeout`` seconds pass (the process is then killed)."""
    deadline = time.monotonic() + timeout
    while not ready():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            output = proc.communicate(timeout=60)[0] or ""
            raise AssertionError(f"the run ended or timed out first:\n{output[-3000:]}")
        time.sleep(0.002)


def train_rows(job: Path) -> int:
    """Rows of ``metrics.jsonl`` holding a training loss (one per logged step and per epoch)."""
    metrics = job / "metrics.jsonl"
    return metrics.read_text().count('"train/loss"') if metrics.exists() else 0


def copy_job(source: Path, target: Path) -> Path:
    """A copy of a job directory (to damage it without touching ``source``)."""
    shutil.copytree(source, target, dirs_exist_ok=True)
    return target


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


def state_digests(job: Path) -> list[str]:
    """The SHA-256 of each rank's final model state, from ``results.json``."""
    return list(json.loads((job / "results.json").read_text())["state_digests"])


def failure_rows(job: Path) -> list[dict[str, Any]]:
    """The job's ``tables/failures.jsonl`` rows (none when the file does not exist)."""
    path = job / "tables" / "failures.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [json.loads(line) for line in lines]


def assert_failures_agree(job: Path) -> None:
    """``tables/failures.jsonl`` and the ``failures`` of ``results.json`` agree: as many rows
    as the total, the same count per kind and per action, and no event logged twice (step,
    kind, layer, and the rank under torchrun)."""
    results = json.loads((job / "results.json").read_text())
    rows = failure_rows(job)
    counted = results["failures"]
    assert counted["total"] == len(rows), (counted, len(rows))
    assert dict(Counter(row["kind"] for row in rows)) == counted["by_kind"], counted
    assert dict(Counter(row["action"] for row in rows)) == counted["by_action"], counted
    events = Counter((row["step"], row["kind"], row["layer"], row.get("rank")) for row in rows)
    assert not [e for e, n in events.items() if n > 1], "failure events logged twice"
