"""Graceful preemption of ``experiments.train`` end to end (subprocesses).

A real run receives SIGTERM, SIGUSR1 or SIGINT once training has started (after 1, 5 or 9 logged
training steps); it must finish its step, write a checkpoint and ``results.json`` with
``status: "preempted"``, and exit with 128 + the signal number, with no mid-epoch checkpoints
configured (``checkpoint_every=0``, the default, so the checkpoint is the preemption's own).
Running the same command again must end exactly like an uninterrupted run: metrics, failure
counts, logged rows and parameters (wall-clock fields excluded).

Under the submitit launcher (``hydra/launcher=submitit_local``: submitit's local executor
starts the job process and requeues it), SIGUSR1, a scheduler's preemption signal that submitit
itself does not handle (before, the job was lost with ``UncompletedJobError``), must make the
job checkpoint, requeue itself through submitit's ``checkpoint()`` hook, resume in the same job
directory and end exactly like the uninterrupted run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers.train_jobs import (
    job_parameters,
    job_results,
    metric_rows,
    run_train,
    train_command,
    train_env,
)

ROOT = Path(__file__).resolve().parents[3]
ARGS = [
    "epochs=4", "data.train_size=48", "data.val_size=16", "data.image_size=32",
    "data.num_classes=3", "context.rank=4", "context.steps=3", "context.eval_steps=3",
    "batch_size=8", "progress=false", "threads=1", "diagnostics.every=2", "log_every=1",
]  # fmt: skip
STEPS_PER_EPOCH = 6
TIMEOUT_S = 240

pytestmark = pytest.mark.slow


def _command(job: Path) -> list[str]:
    return train_command(job, ARGS)


def _run(job: Path) -> subprocess.CompletedProcess[str]:
    return run_train(job, ARGS, timeout=TIMEOUT_S)


_env, _results, _rows, _parameters = train_env, job_results, metric_rows, job_parameters


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    job = tmp_path_factory.mktemp("reference")
    proc = _run(job)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return job


def _train_rows(job: Path) -> int:
    metrics = job / "metrics.jsonl"
    return metrics.read_text().count('"train/loss"') if metrics.exists() else 0


@pytest.mark.parametrize(
    ("signum", "rows"),
    [(signal.SIGTERM, 1), (signal.SIGUSR1, 5), (signal.SIGINT, 9)],
    ids=["SIGTERM", "SIGUSR1", "SIGINT"],
)
def test_signal_checkpoints_and_resumes_identically(
    reference: Path, tmp_path: Path, signum: signal.Signals, rows: int
) -> None:
    proc = subprocess.Popen(_command(tmp_path), cwd=ROOT, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while _train_rows(tmp_path) < rows:  # a different moment for each signal
            assert proc.poll() is None and time.monotonic() < deadline, "no training step"
            time.sleep(0.002)
        proc.send_signal(signum)
        log, _ = proc.communicate(timeout=TIMEOUT_S)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signum, log[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["status"] == "preempted" and results["signal"] == signum.name
    step = results["step"]
    assert 0 < step < 4 * STEPS_PER_EPOCH, "the run finished before the signal"
    assert (tmp_path / "checkpoints" / f"step-{step:09d}.pt").exists()
    assert f"received {signum.name}" in log

    proc2 = _run(tmp_path)
    assert proc2.returncode == 0, proc2.stderr[-3000:]
    assert f"step {step}" in proc2.stdout + proc2.stderr  # "resuming from ...: ..., step N"
    assert _results(tmp_path) == _results(reference)
    a, b = _parameters(tmp_path), _parameters(reference)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert _rows(tmp_path) == _rows(reference)


def _holder_pid(job: Path) -> int | None:
    try:
        return int(json.loads((job / ".lock").read_text() or "{}").get("pid"))
    except (OSError, ValueError, TypeError):
        return None


def test_sigusr1_under_submitit_requeues_and_resumes_identically(
    reference: Path, tmp_path: Path
) -> None:
    sweep = tmp_path / "sweep"
    command = [sys.executable, "-m", "experiments.train", "-m", "hydra/launcher=submitit_local",
               f"hydra.sweep.dir={sweep}", *ARGS]  # fmt: skip
    launcher = subprocess.Popen(command, cwd=ROOT, env=_env(), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)  # fmt: skip
    job = sweep / "0"
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while _train_rows(job) < 3 or _holder_pid(job) is None:
            assert launcher.poll() is None and time.monotonic() < deadline, "no training step"
            time.sleep(0.005)
        first = _holder_pid(job)
        assert first is not None
        os.kill(first, signal.SIGUSR1)
        output, _ = launcher.communicate(timeout=TIMEOUT_S)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait(timeout=30)
    assert launcher.returncode == 0, output[-3000:]
    logs = "".join(p.read_text() for p in (sweep / ".submitit").rglob("*_log.*"))
    assert "preempted by SIGUSR1" in logs
    assert "Requeued job" in logs
    assert _results(job) == _results(reference)
    assert _rows(job) == _rows(reference)
    parameters, expected = _parameters(job), _parameters(reference)
    assert parameters.keys() == expected.keys()
    for key, value in expected.items():
        assert parameters[key].equal(value), key
