"""Honest logs across restarts of ``experiments.train`` (subprocesses).

A run SIGKILLed before its first checkpoint starts again from step 0: it must remove the earlier
attempt's metric and failure rows (not append to them), so its files equal an uninterrupted
run's and ``tables/failures.jsonl`` agrees with ``results.json``. A run resumed from a
checkpoint must report the train time of the whole run and the solver statistics even when it
had nothing left to train. The implicit adjoint is used because its backward solves miss their
tolerance (failure events to count).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from experiments.engine.checkpoint import read_checkpoint

ROOT = Path(__file__).resolve().parents[3]
ARGS = [
    "epochs=2", "data.train_size=48", "data.val_size=16", "data.image_size=32",
    "data.num_classes=3", "context.rank=4", "context.steps=3", "context.eval_steps=3",
    "batch_size=8", "progress=false", "threads=1", "diagnostics.every=2", "log_every=1",
    "adjoint=implicit",
]  # fmt: skip
TIMEOUT_S = 240

pytestmark = pytest.mark.slow


def _command(job: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "experiments.train", *ARGS, *extra, f"hydra.run.dir={job}"]


def _env() -> dict[str, str]:
    return {**os.environ, "WANDB_MODE": "offline", "HYDRA_FULL_ERROR": "1", "OMP_NUM_THREADS": "1"}


def _run(job: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(_command(job, *extra), cwd=ROOT, env=_env(), capture_output=True,
                          text=True, timeout=TIMEOUT_S, check=False)  # fmt: skip


def _untimed(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if "time" not in k and "seconds" not in k}


def _lines(path: Path) -> list[dict[str, Any]]:
    return [_untimed(json.loads(line)) for line in path.read_text().splitlines()]


def _kill_when(proc: subprocess.Popen[bytes], ready: Any) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while not ready():
            assert proc.poll() is None and time.monotonic() < deadline, "run ended too early"
            time.sleep(0.005)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=TIMEOUT_S)
    finally:
        proc.kill()


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    job = tmp_path_factory.mktemp("reference")
    proc = _run(job)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return job


def test_fresh_restart_truncates_the_earlier_attempts_logs(reference: Path, tmp_path: Path) -> None:
    metrics = tmp_path / "metrics.jsonl"
    proc = subprocess.Popen(_command(tmp_path), cwd=ROOT, env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    _kill_when(proc, lambda: metrics.exists() and len(metrics.read_text().splitlines()) >= 3)
    assert not list((tmp_path / "checkpoints").glob("step-*.pt")), "killed after a checkpoint"
    assert len(metrics.read_text().splitlines()) >= 3  # the earlier attempt's rows

    proc2 = _run(tmp_path)
    assert proc2.returncode == 0, proc2.stderr[-3000:]
    assert "removing the metric files of an earlier attempt" in proc2.stdout + proc2.stderr
    assert _lines(metrics) == _lines(reference / "metrics.jsonl")
    csv_rows = (tmp_path / "metrics.csv").read_text().splitlines()
    assert len(csv_rows) == len((reference / "metrics.csv").read_text().splitlines())
    failures = _lines(tmp_path / "tables" / "failures.jsonl")
    assert failures == _lines(reference / "tables" / "failures.jsonl")
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["failures"]["total"] == len(failures) > 0


def test_resumed_run_reports_the_whole_runs_time_and_solver_stats(tmp_path: Path) -> None:
    checkpoints = tmp_path / "checkpoints"
    done = checkpoints / "step-000000012.pt"  # the last epoch's end: nothing left to train
    proc = subprocess.Popen(_command(tmp_path), cwd=ROOT, env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    _kill_when(proc, done.exists)
    if (tmp_path / "results.json").exists():
        pytest.skip("the run wrote results.json before it could be killed")
    totals = read_checkpoint(done)["totals"]
    assert totals["train_time_s"] > 0 and totals["solver"]

    proc2 = _run(tmp_path)
    assert proc2.returncode == 0, proc2.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["train_time_s"] >= totals["train_time_s"]
    assert results["solver"] == json.loads(json.dumps(totals["solver"]))
    failures = (tmp_path / "tables" / "failures.jsonl").read_text().splitlines()
    assert results["failures"]["total"] == len(failures) > 0
