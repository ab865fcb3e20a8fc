"""``python -m experiments.generate`` on a shared cluster, through the real command (tiny
subprocess runs, ``helpers.generate_jobs``), with the engine's pieces that
``experiments.train`` uses:

* SIGTERM, then (run again) SIGUSR1, each at a seeded random moment (a random number of logged
  steps after the segment's start plus a random delay of 0-30 ms): each run finishes its step,
  writes a checkpoint and ``results.json`` ``status: "preempted"`` and exits with 128 + the
  signal number; the next run resumes and ends bit-identical to an uninterrupted run (results,
  metric rows, generator / discriminator / EMA weights). The seed is in every message;
  ``IMPLICIT_HAM_SIGNAL_SEED`` replays one.
* a second command in the directory of a running job is refused with ``JobLockedError`` naming
  the holder and writes nothing there; the first finishes exactly like the reference.
* every checkpoint of a finished job's copy truncated (its ``results.json`` gone): each named
  and moved aside, the job starts from scratch in the same run and ends like the reference.
* ``hydra.launcher.tasks_per_node=2`` without a distributed environment is refused before
  anything runs.
* a run that diverges (huge learning rates, ``skip_batch`` with a limit of 2 dropped updates
  in a row) fails, and its ``results.json`` carries the failure counts of
  ``tables/failures.jsonl``.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import time
from collections import Counter
from pathlib import Path

import pytest
from helpers.generate_jobs import (
    TINY_STEPS,
    assert_same_generation,
    run_generate,
    start_generate,
    step_rows,
    write_untrained_classifier,
)
from helpers.train_jobs import failure_rows, wait_for

TIMEOUT_S = 120


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder whose jobs share an untrained classifier (``<root>/classifier.pt``)."""
    folder = tmp_path_factory.mktemp("generate")
    write_untrained_classifier(folder / "classifier.pt")
    return folder


@pytest.fixture(scope="module")
def reference(root: Path) -> Path:
    job = root / "reference"
    proc = run_generate(job, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return job


def _seed() -> int:
    seed = os.environ.get("IMPLICIT_HAM_SIGNAL_SEED")
    return int(seed) if seed else random.SystemRandom().randrange(2**32)


@pytest.mark.slow
def test_signals_at_random_moments_checkpoint_and_resume_identically(
    root: Path, reference: Path
) -> None:
    job, seed = root / "preempted", _seed()
    rng = random.Random(seed)
    step = None
    for signum in (signal.SIGTERM, signal.SIGUSR1):
        rows, delay = step_rows(job) + rng.randint(1, 5), rng.uniform(0.0, 0.03)
        why = f"seed {seed}: {signum.name} once {rows} steps are logged + {delay * 1e3:.0f} ms"
        proc = start_generate(job)
        try:
            wait_for(proc, lambda rows=rows: step_rows(job) >= rows, TIMEOUT_S)
            time.sleep(delay)
            proc.send_signal(signum)
            log = proc.communicate(timeout=TIMEOUT_S)[0]
        finally:
            proc.kill()
            proc.wait(timeout=60)
        assert proc.returncode == 128 + signum, f"{why}: exit {proc.returncode}\n{log[-3000:]}"
        if step is not None:  # this segment resumed from the previous preemption's checkpoint
            assert f"step {step}" in log, why
        results = json.loads((job / "results.json").read_text())
        assert results["status"] == "preempted" and results["signal"] == signum.name, why
        step = int(results["step"])
        assert 0 < step < TINY_STEPS, f"{why}: the run finished before the signal"
        assert (job / "checkpoints" / f"step-{step:09d}.pt").exists(), why
        assert f"received {signum.name}" in log and step_rows(job) == step, why
    proc = run_generate(job, timeout=TIMEOUT_S)
    assert proc.returncode == 0, f"seed {seed}\n{proc.stderr[-3000:]}"
    assert f"step {step}" in proc.stdout + proc.stderr, f"seed {seed}: not resumed"
    assert_same_generation(job, reference, f"seed {seed}")


def test_a_second_command_in_a_running_jobs_directory_is_refused(
    root: Path, reference: Path
) -> None:
    job = root / "locked"
    first = start_generate(job)
    try:
        wait_for(first, lambda: step_rows(job) >= 1, TIMEOUT_S)
        first.send_signal(signal.SIGSTOP)  # holds the lock, mid-training, while the second runs
        try:
            rows = (job / "metrics.jsonl").read_text()
            second = run_generate(job, timeout=TIMEOUT_S)
        finally:
            first.send_signal(signal.SIGCONT)
        output = first.communicate(timeout=TIMEOUT_S)[0]
    finally:
        first.kill()
        first.wait(timeout=60)
    assert second.returncode != 0 and "JobLockedError" in second.stderr, second.stderr[-3000:]
    assert f"is in use by another run: host {socket.gethostname()}, pid {first.pid}, started" in (
        second.stderr
    ), second.stderr[-3000:]
    assert (job / "metrics.jsonl").read_text().startswith(rows)  # the second logged nothing
    assert first.returncode == 0, output[-3000:]
    assert_same_generation(job, reference, "the lock holder")


def test_every_checkpoint_bad_is_named_and_the_job_ends_like_an_intact_run(
    root: Path, reference: Path
) -> None:
    job = root / "damaged"
    shutil.copytree(reference, job)
    (job / "results.json").unlink()
    checkpoints = sorted((job / "checkpoints").glob("step-*.pt"))
    assert len(checkpoints) == 2
    for path in checkpoints:
        path.write_bytes(path.read_bytes()[:100])
    proc = run_generate(job, timeout=TIMEOUT_S)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-3000:]
    for path in checkpoints:
        assert str(path) in log and path.with_name(path.name + ".corrupt").exists()
    assert "every checkpoint in" in log and "starting from scratch" in log
    assert_same_generation(job, reference, "every checkpoint bad")


def test_a_failed_run_reports_the_failure_counts_it_logged(root: Path) -> None:
    job = root / "diverged"
    proc = run_generate(job, "gan.lr_d=1e30", "gan.lr_g=1e30", "gan.max_consecutive_failures=2",
                        timeout=TIMEOUT_S)  # fmt: skip
    assert proc.returncode != 0 and "GanDivergedError" in proc.stderr, proc.stderr[-3000:]
    results = json.loads((job / "results.json").read_text())
    assert results["status"] == "failed" and "GanDivergedError" in results["error"]
    rows, counted = failure_rows(job), results["failures"]
    assert rows and counted["total"] == len(rows)
    assert counted["by_kind"] == dict(Counter(row["kind"] for row in rows))
    assert counted["by_action"] == dict(Counter(row["action"] for row in rows)) == {
        "skipped": len(rows)
    }
    dropped = Counter(row["layer"].strip("(").split()[0] for row in rows)
    assert counted["skipped_updates"] == {"D": dropped["D"], "G": dropped["G"]}


def test_tasks_per_node_without_distributed_environment_is_refused(root: Path) -> None:
    """As for ``experiments.train``: several tasks per node without a distributed environment
    would start independent copies writing one job directory; the command refuses before
    anything is trained or logged."""
    job = root / "tasks_per_node"
    proc = run_generate(job, "+hydra.launcher.tasks_per_node=2", timeout=TIMEOUT_S)
    assert proc.returncode != 0
    assert "hydra.launcher.tasks_per_node=2 but no distributed environment" in proc.stderr
    assert not (job / "metrics.jsonl").exists() and not (job / "results.json").exists()
