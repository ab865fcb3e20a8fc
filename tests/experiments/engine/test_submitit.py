"""Preemption under the submitit launcher (``hydra/launcher=submitit_local``, submitit's local
executor: a real job process started and requeued by submitit).

SIGUSR1 (a scheduler's preemption signal that submitit itself does not handle; before, the
job was lost with ``UncompletedJobError``) is sent to the job process once training runs: the
job must checkpoint, write ``results.json`` ``status: "preempted"``, requeue itself through
submitit's ``checkpoint()`` hook, resume in the same job directory and end exactly like an
uninterrupted run. The unit tests check the hook's parts without a job."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.train_jobs import job_parameters, job_results, metric_rows, run_train, train_env

from experiments.engine import submitit_requeue
from experiments.engine.submitit_requeue import TrainJob, preemption_signals

ROOT = Path(__file__).resolve().parents[3]
ARGS = [
    "epochs=3", "data.train_size=32", "data.val_size=8", "data.image_size=32",
    "data.num_classes=3", "context.rank=4", "context.steps=3", "context.eval_steps=3",
    "batch_size=8", "progress=false", "threads=1", "log_every=1",
]  # fmt: skip
TIMEOUT_S = 300


def _train_rows(job: Path) -> int:
    metrics = job / "metrics.jsonl"
    return metrics.read_text().count('"train/loss"') if metrics.exists() else 0


def _holder_pid(job: Path) -> int | None:
    try:
        return int(json.loads((job / ".lock").read_text() or "{}").get("pid"))
    except (OSError, ValueError, TypeError):
        return None


@pytest.mark.slow
def test_sigusr1_under_submitit_requeues_and_resumes_identically(tmp_path: Path) -> None:
    reference = tmp_path / "reference"
    proc = run_train(reference, ARGS, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]

    sweep = tmp_path / "sweep"
    command = [sys.executable, "-m", "experiments.train", "-m", "hydra/launcher=submitit_local",
               f"hydra.sweep.dir={sweep}", *ARGS]  # fmt: skip
    launcher = subprocess.Popen(command, cwd=ROOT, env=train_env(), stdout=subprocess.PIPE,
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
    assert job_results(job) == job_results(reference)
    assert metric_rows(job) == metric_rows(reference)
    parameters, expected = job_parameters(job), job_parameters(reference)
    assert parameters.keys() == expected.keys()
    for key, value in expected.items():
        assert parameters[key].equal(value), key


def test_outside_submitit_signals_are_unchanged_and_requeue_is_a_no_op(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("SUBMITIT_FOLDER", raising=False)
    assert preemption_signals([signal.SIGTERM]) == [signal.SIGTERM]
    submitit_requeue.requeue(signal.SIGTERM)  # returns: nothing to requeue


def test_under_submitit_its_preemption_signal_is_handled_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SUBMITIT_FOLDER", "/nonexistent")
    signals = preemption_signals([signal.SIGUSR1, signal.SIGTERM])
    assert signals == [signal.SIGUSR1, signal.SIGTERM, signal.SIGUSR2]  # USR2: submitit's
    assert preemption_signals([signal.SIGUSR2]) == [signal.SIGUSR2]


def test_train_job_checkpoint_resubmits_the_same_job(tmp_path: Path) -> None:
    job = TrainJob()
    delayed = job.checkpoint({"epochs": 1}, tmp_path)
    assert isinstance(delayed.function, TrainJob)
    assert delayed.args == ({"epochs": 1}, tmp_path)
    assert hasattr(delayed.function, "checkpoint")  # requeued again on the next preemption
