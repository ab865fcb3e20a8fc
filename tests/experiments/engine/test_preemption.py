"""Graceful preemption of ``experiments.train`` end to end (subprocesses).

A real run receives SIGTERM, then (run again) SIGUSR1, then SIGINT, each at a random moment
(a seeded number of logged training rows after the segment's start plus a random delay: the
signal may land mid-step, during a checkpoint write or during an evaluation); another run
receives a signal while it evaluates (its log says ``epoch N/M: evaluating``). Each time the
run must finish its step (or evaluation), write a checkpoint and ``results.json`` with
``status: "preempted"``, and exit with 128 + the signal number, with no mid-epoch checkpoints
configured (``checkpoint_every=0``, the default, so the checkpoint is the preemption's own).
Running the same command again must end exactly like an uninterrupted run: metrics, failure
counts, logged rows, state digests and parameters (wall-clock fields excluded), with
``tables/failures.jsonl`` agreeing with ``results.json`` (the implicit adjoint logs a failure
event at every step). The random seed is in every assertion message; set
``IMPLICIT_HAM_SIGNAL_SEED`` to replay one.

Under the submitit launcher (``hydra/launcher=submitit_local``: submitit's local executor
starts the job process and requeues it), SIGUSR1 (a scheduler's signal that submitit itself
does not handle: before, the job was lost with ``UncompletedJobError``), SIGUSR2 (submitit's
own preemption signal) and SIGTERM, sent one after the other to the job's successive processes,
must each make the job checkpoint, requeue itself through submitit's ``checkpoint()`` hook and
resume in the same job directory; the job must end exactly like the uninterrupted run.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from helpers.train_jobs import (
    assert_failures_agree,
    job_parameters,
    job_results,
    metric_rows,
    run_train,
    start_train,
    state_digests,
    train_env,
    train_rows,
    wait_for,
)

ROOT = Path(__file__).resolve().parents[3]
ARGS = [
    "epochs=4", "data.train_size=48", "data.val_size=48", "data.image_size=32",
    "data.num_classes=3", "context.rank=4", "context.steps=3", "context.eval_steps=3",
    "batch_size=8", "progress=false", "threads=1", "diagnostics.every=2", "log_every=1",
    "adjoint=implicit",
]  # fmt: skip
EPOCHS, STEPS_PER_EPOCH = 4, 6
TIMEOUT_S = 240

pytestmark = pytest.mark.slow


def _seed() -> int:
    seed = os.environ.get("IMPLICIT_HAM_SIGNAL_SEED")
    return int(seed) if seed else random.SystemRandom().randrange(2**32)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    job = tmp_path_factory.mktemp("reference")
    proc = run_train(job, ARGS, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return job


def _assert_same_run(job: Path, reference: Path, why: str) -> None:
    """The job ended exactly like the reference (``why`` goes into every message)."""
    assert job_results(job) == job_results(reference), why
    assert state_digests(job) == state_digests(reference), why
    assert metric_rows(job) == metric_rows(reference), why
    a, b = job_parameters(job), job_parameters(reference)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), why
    assert_failures_agree(job)


def _assert_preempted(job: Path, signum: signal.Signals, code: int, log: str, why: str) -> int:
    """The run stopped on ``signum`` with its checkpoint; returns the step it stopped after."""
    assert code == 128 + signum, f"{why}: exit status {code}\n{log[-3000:]}"
    results = json.loads((job / "results.json").read_text())
    assert results["status"] == "preempted" and results["signal"] == signum.name, why
    step = int(results["step"])
    assert 0 < step < EPOCHS * STEPS_PER_EPOCH, f"{why}: the run finished before the signal"
    assert (job / "checkpoints" / f"step-{step:09d}.pt").exists(), why
    assert f"received {signum.name}" in log, why
    return step


def _rows_reach(job: Path, rows: int) -> Callable[[], bool]:
    """Whether the job's ``metrics.jsonl`` holds ``rows`` training-loss rows."""
    return lambda: train_rows(job) >= rows


def _signal_when(
    job: Path, signum: signal.Signals, ready: Callable[[], bool], delay: float = 0.0
) -> tuple[int, str]:
    """Start the job, send ``signum`` once ``ready()`` holds (and ``delay`` s more); return
    its exit status and output."""
    proc = start_train(job, ARGS)
    try:
        wait_for(proc, ready, TIMEOUT_S)
        time.sleep(delay)
        proc.send_signal(signum)
        output = proc.communicate(timeout=TIMEOUT_S)[0]
    finally:
        proc.kill()
        proc.wait(timeout=60)
    return proc.returncode, output


def test_signals_at_random_moments_checkpoint_and_resume_identically(
    reference: Path, tmp_path: Path
) -> None:
    seed = _seed()
    rng = random.Random(seed)
    step = None
    for signum in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):
        start, rows, delay = train_rows(tmp_path), rng.randint(1, 6), rng.uniform(0.0, 0.03)
        why = f"seed {seed}: {signum.name} after {rows} more logged rows + {delay * 1e3:.0f} ms"
        code, log = _signal_when(tmp_path, signum, _rows_reach(tmp_path, start + rows), delay)
        if step is not None:  # the segment resumed from the previous preemption's checkpoint
            assert f"step {step}" in log, why
        step = _assert_preempted(tmp_path, signum, code, log, why)
    proc = run_train(tmp_path, ARGS, timeout=TIMEOUT_S)
    assert proc.returncode == 0, f"seed {seed}\n{proc.stderr[-3000:]}"
    _assert_same_run(tmp_path, reference, f"seed {seed}")


def test_signal_during_evaluation_checkpoints_and_resumes_identically(
    reference: Path, tmp_path: Path
) -> None:
    seed = _seed()
    epoch = random.Random(seed).randint(1, EPOCHS - 1)  # the last epoch's signal is ignored
    why = f"seed {seed}: SIGUSR1 during the evaluation of epoch {epoch}"
    log_file = tmp_path / "train.log"
    started = f"epoch {epoch}/{EPOCHS}: evaluating"

    def evaluating() -> bool:
        return log_file.exists() and started in log_file.read_text()

    code, log = _signal_when(tmp_path, signal.SIGUSR1, evaluating)
    step = _assert_preempted(tmp_path, signal.SIGUSR1, code, log, why)
    assert step == epoch * STEPS_PER_EPOCH, why
    text = log_file.read_text()
    received = text.index("received SIGUSR1")
    assert text.index(started) < received < text.index(f"epoch {epoch}/{EPOCHS}  train/loss"), (
        f"{why}: the signal did not arrive while the evaluation ran"
    )
    proc = run_train(tmp_path, ARGS, timeout=TIMEOUT_S)
    assert proc.returncode == 0, f"{why}\n{proc.stderr[-3000:]}"
    assert f"step {step}" in proc.stdout + proc.stderr, why  # "resuming from ...: ..., step N"
    _assert_same_run(tmp_path, reference, why)


def _holder_pid(job: Path) -> int | None:
    try:
        return int(json.loads((job / ".lock").read_text() or "{}").get("pid"))
    except (OSError, ValueError, TypeError):
        return None


def test_signals_under_submitit_requeue_and_resume_identically(
    reference: Path, tmp_path: Path
) -> None:
    sweep = tmp_path / "sweep"
    command = [sys.executable, "-m", "experiments.train", "-m", "hydra/launcher=submitit_local",
               f"hydra.sweep.dir={sweep}", *ARGS]  # fmt: skip
    launcher = subprocess.Popen(command, cwd=ROOT, env=train_env(), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)  # fmt: skip
    job = sweep / "0"
    signals = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM)
    pids: list[int] = []
    try:
        for signum in signals:  # one signal to each of the job's successive processes
            rows_reached = _rows_reach(job, train_rows(job) + 3)

            def ready(rows_reached: Callable[[], bool] = rows_reached) -> bool:
                pid = _holder_pid(job)
                return pid is not None and pid not in pids and rows_reached()

            wait_for(launcher, ready, TIMEOUT_S)
            pid = _holder_pid(job)
            assert pid is not None
            pids.append(pid)
            os.kill(pid, signum)
        output = launcher.communicate(timeout=TIMEOUT_S)[0]
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait(timeout=30)
    assert launcher.returncode == 0, output[-3000:]
    logs = "".join(p.read_text() for p in (sweep / ".submitit").rglob("*_log.*"))
    for signum in signals:
        assert f"preempted by {signum.name}" in logs, signum.name
    assert logs.count("Requeued job") >= len(signals)
    _assert_same_run(job, reference, "submitit: SIGUSR1, SIGUSR2, SIGTERM")
