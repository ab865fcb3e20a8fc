"""Honest logs across restarts of ``experiments.train`` (subprocesses).

A run SIGKILLed before its first checkpoint starts again from step 0: it must remove the earlier
attempt's metric and failure rows (not append to them), so its files equal an uninterrupted
run's and ``tables/failures.jsonl`` agrees with ``results.json``. A run resumed from a
checkpoint must report the train time of the whole run and the solver statistics even when it
had nothing left to train. The implicit adjoint is used because its backward solves miss their
tolerance (failure events to count).

Damaged job directories (copies of a finished job), run again with the same command: a garbled
``results.json`` is named and moved aside, and the job's results are rebuilt from its last
checkpoint (not "ok" with empty statistics); when every checkpoint is bad the job starts from
scratch without logging a row twice; a crafted checkpoint (a valid torch file with a matching
digest whose unpickling would run code) is refused as a ``CheckpointError`` naming the file,
moved aside, never executed, and the previous checkpoint is used.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.train_jobs import (
    assert_failures_agree,
    copy_job,
    job_results,
    metric_rows,
    run_train,
    start_train,
    state_digests,
    wait_for,
)

from experiments.engine.checkpoint import read_checkpoint, sidecar

ARGS = [
    "epochs=2", "data.train_size=48", "data.val_size=16", "data.image_size=32",
    "data.num_classes=3", "context.rank=4", "context.steps=3", "context.eval_steps=3",
    "batch_size=8", "progress=false", "threads=1", "diagnostics.every=2", "log_every=1",
    "adjoint=implicit",
]  # fmt: skip
TIMEOUT_S = 240

pytestmark = pytest.mark.slow


def _run(job: Path) -> Any:
    return run_train(job, ARGS, timeout=TIMEOUT_S)


def _lines(path: Path) -> list[dict[str, Any]]:
    return [
        {k: v for k, v in json.loads(line).items() if "time" not in k and "seconds" not in k}
        for line in path.read_text().splitlines()
    ]


def _kill_when(job: Path, ready: Any) -> None:
    proc = start_train(job, ARGS)
    try:
        wait_for(proc, ready, TIMEOUT_S)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=TIMEOUT_S)
    finally:
        proc.kill()
        proc.communicate(timeout=60)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    job = tmp_path_factory.mktemp("reference")
    proc = _run(job)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return job


def test_fresh_restart_truncates_the_earlier_attempts_logs(reference: Path, tmp_path: Path) -> None:
    metrics = tmp_path / "metrics.jsonl"
    _kill_when(tmp_path, lambda: metrics.exists() and len(metrics.read_text().splitlines()) >= 3)
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
    assert_failures_agree(tmp_path)
    assert json.loads((tmp_path / "results.json").read_text())["failures"]["total"] > 0


def test_resumed_run_reports_the_whole_runs_time_and_solver_stats(tmp_path: Path) -> None:
    done = tmp_path / "checkpoints" / "step-000000012.pt"  # the last epoch's: nothing left
    _kill_when(tmp_path, done.exists)
    if (tmp_path / "results.json").exists():
        pytest.skip("the run wrote results.json before it could be killed")
    totals = read_checkpoint(done)["totals"]
    assert totals["train_time_s"] > 0 and totals["solver"]

    proc2 = _run(tmp_path)
    assert proc2.returncode == 0, proc2.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["train_time_s"] >= totals["train_time_s"]
    assert results["solver"] == json.loads(json.dumps(totals["solver"]))
    assert_failures_agree(tmp_path)
    assert results["failures"]["total"] > 0


def _garble_results(job: Path) -> str:
    (job / "results.json").write_text('{"status": "ok", "metr')
    return f"{job / 'results.json'} is damaged"


def _break_every_checkpoint(job: Path) -> str:
    (job / "results.json").unlink()  # an unfinished job (killed before it wrote them)
    for path in sorted((job / "checkpoints").glob("step-*.pt")):
        path.write_bytes(path.read_bytes()[:1000])
    return "every checkpoint in"


class _Payload:
    """Unpickling it would create the file ``marker`` (it never may)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def _craft_newest_checkpoint(job: Path) -> str:
    (job / "results.json").unlink()
    newest = sorted((job / "checkpoints").glob("step-*.pt"))[-1]
    torch.save({"model": _Payload(job / "pwned"), "train_state": {}}, newest)
    data = newest.read_bytes()  # a digest that matches: only the unpickler can refuse it
    sidecar(newest).write_text(f"sha256={hashlib.sha256(data).hexdigest()} bytes={len(data)}\n")
    return f"{newest} is not a loadable checkpoint"


DAMAGES = {
    "garbled_results": _garble_results,
    "every_checkpoint_bad": _break_every_checkpoint,
    "crafted_checkpoint": _craft_newest_checkpoint,
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_damaged_job_is_named_and_ends_like_an_intact_run(
    reference: Path, tmp_path: Path, damage: str
) -> None:
    job = copy_job(reference, tmp_path / "job")
    named = DAMAGES[damage](job)
    proc = _run(job)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-3000:]
    assert named in log, log[-3000:]
    assert job_results(job) == job_results(reference)  # not "ok" with empty statistics
    assert state_digests(job) == state_digests(reference)
    assert metric_rows(job) == metric_rows(reference)  # no row logged twice
    assert_failures_agree(job)
    if damage == "garbled_results":
        assert (job / "results.json.corrupt").read_text() == '{"status": "ok", "metr'
        assert "resuming from" in log  # the results were rebuilt from the last checkpoint
    if damage == "every_checkpoint_bad":
        assert "removing the metric files of an earlier attempt" in log
        assert len(list((job / "checkpoints").glob("*.pt.corrupt"))) == 2
    if damage == "crafted_checkpoint":
        assert not (job / "pwned").exists(), "the crafted checkpoint ran its payload"
        assert (job / "checkpoints" / "step-000000012.pt.corrupt").exists()
        assert "resuming from" in log and "step-000000006.pt" in log


def test_resume_with_another_thread_count_is_refused_by_the_command(
    reference: Path, tmp_path: Path
) -> None:
    """``threads`` is recorded (results and checkpoints) and compared on resume: the command
    run again with ``threads=2`` on a job interrupted under ``threads=1`` exits with
    ``ResumeConflictError`` naming both counts and leaves the job's files alone."""
    assert json.loads((reference / "results.json").read_text())["threads"] == 1
    job = copy_job(reference, tmp_path / "job")
    (job / "results.json").unlink()  # interrupted before its results
    rows = (job / "metrics.jsonl").read_text()
    proc = run_train(job, [a for a in ARGS if a != "threads=1"], "threads=2", timeout=TIMEOUT_S)
    assert proc.returncode != 0
    assert "ResumeConflictError" in proc.stderr, proc.stderr[-3000:]
    assert "written with 1 CPU thread(s)" in proc.stderr and "this run has 2" in proc.stderr
    assert "reliability.threads_change=warn" in proc.stderr
    assert not (job / "results.json").exists() and (job / "metrics.jsonl").read_text() == rows
