"""One writer per job directory: ``JobLock`` in-process, and two real ``experiments.train``
processes started in one directory (the second must refuse, naming the first)."""

from __future__ import annotations

import fcntl
import json
import logging
import multiprocessing
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from experiments.engine.joblock import LOCK_FILE, JobLock, JobLockedError

ROOT = Path(__file__).resolve().parents[3]
TIMEOUT_S = 240


def _dead_pid() -> int:
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True, timeout=60)  # fmt: skip
    return int(proc.stdout)


def test_second_holder_is_refused_with_the_holders_identity(tmp_path: Path) -> None:
    with JobLock(tmp_path):
        record = json.loads((tmp_path / LOCK_FILE).read_text())
        assert record["pid"] == os.getpid() and record["host"] == socket.gethostname()
        with pytest.raises(JobLockedError) as err:
            JobLock(tmp_path).acquire()
        assert f"pid {os.getpid()}" in str(err.value)
        assert socket.gethostname() in str(err.value) and record["started"] in str(err.value)
    with JobLock(tmp_path):  # released on exit: taken again
        pass
    assert (tmp_path / LOCK_FILE).read_text() == ""  # a clean release leaves no holder


def test_stale_record_of_a_dead_writer_is_taken_over_with_a_log_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    dead = _dead_pid()
    stale = {"host": socket.gethostname(), "pid": dead, "started": "2026-01-01T00:00:00"}
    (tmp_path / LOCK_FILE).write_text(json.dumps(stale))
    with caplog.at_level(logging.WARNING), JobLock(tmp_path):
        assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()
    assert f"pid {dead}" in caplog.text and "taken over" in caplog.text


def test_lock_kept_by_an_orphan_of_a_dead_writer_is_taken_over(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    dead = _dead_pid()
    path = tmp_path / LOCK_FILE
    stale = {"host": socket.gethostname(), "pid": dead, "started": "2026-01-01T00:00:00"}
    path.write_text(json.dumps(stale))
    orphan = os.open(path, os.O_RDWR)  # e.g. a forked data-loader worker still holding it
    try:
        fcntl.flock(orphan, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with caplog.at_level(logging.WARNING), JobLock(tmp_path):
            assert json.loads(path.read_text())["pid"] == os.getpid()
        assert "outlived its writer" in caplog.text
    finally:
        os.close(orphan)


def _contend(directory: Path, start: Any, tried: Any, held: Any) -> None:
    """One of several processes started together: try the lock, say whether it was taken, and
    keep it until every contender has tried."""
    start.wait()
    lock = JobLock(directory)
    try:
        lock.acquire()
        held.put(os.getpid())
    except JobLockedError:
        pass
    tried.wait()
    lock.release()


def test_stale_record_taken_over_by_one_of_several_commands_started_together(
    tmp_path: Path,
) -> None:
    """Issue 47 item 1: a stale record of a kill -9'd writer and 4 processes starting at once
    (30 trials): exactly one holds the lock each time (the old take-over let a loser of the
    flock unlink the file the winner held before it had written its record: 2 holders)."""
    context = multiprocessing.get_context("fork")
    stale = {"host": socket.gethostname(), "pid": _dead_pid(), "started": "2026-01-01T00:00:00"}
    holders = []
    for trial in range(30):
        job = tmp_path / f"trial{trial}"
        job.mkdir()
        (job / LOCK_FILE).write_text(json.dumps(stale))
        start, tried, held = context.Barrier(4), context.Barrier(4), context.Queue()
        procs = [context.Process(target=_contend, args=(job, start, tried, held)) for _ in range(4)]
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join(timeout=60)
        assert [proc.exitcode for proc in procs] == [0] * 4
        pids = []
        while not held.empty():
            pids.append(held.get())
        holders.append(len(pids))
    assert holders == [1] * 30, holders


ARGS = [
    "epochs=3", "data.train_size=48", "data.val_size=16", "data.image_size=32",
    "data.num_classes=3", "context.rank=4", "context.steps=3", "context.eval_steps=3",
    "batch_size=8", "progress=false", "threads=1", "diagnostics.every=2", "log_every=1",
]  # fmt: skip


def _command(job: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "experiments.train", *ARGS, *extra, f"hydra.run.dir={job}"]


def _env() -> dict[str, str]:
    return {**os.environ, "WANDB_MODE": "offline", "HYDRA_FULL_ERROR": "1", "OMP_NUM_THREADS": "1"}


EPOCHS = 60  # long enough that the first run still holds the lock when the second reaches it


def _start(job: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        _command(job, f"epochs={EPOCHS}"), cwd=ROOT, env=_env(), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


@pytest.mark.slow
def test_second_process_in_one_job_directory_is_refused(tmp_path: Path) -> None:
    # the same command twice, the second once the first is training (it holds the lock): a
    # double submission. Started a fixed second apart, a loaded host could let the first finish
    # before the second had imported torch (then the second rightly found a finished job).
    procs = [_start(tmp_path)]
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while not (tmp_path / "metrics.jsonl").exists() and procs[0].poll() is None:
            assert time.monotonic() < deadline, "the first run never started training"
            time.sleep(0.1)
        procs.append(_start(tmp_path))
        logs = [p.communicate(timeout=TIMEOUT_S)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    codes = [p.returncode for p in procs]
    assert sorted(c == 0 for c in codes) == [False, True], (codes, [log[-2000:] for log in logs])
    winner, loser = (0, 1) if codes[0] == 0 else (1, 0)
    holder = f"in use by another run: host {socket.gethostname()}, pid {procs[winner].pid}"
    assert holder in logs[loser]
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["status"] == "ok"  # the refused process wrote nothing over the winner's
    rows = [json.loads(r) for r in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    # one writer: every step and every epoch logged once, in order (6 steps an epoch)
    steps = [r["step"] for r in rows if "train/loss" in r and "epoch" not in r]
    assert steps == list(range(6 * EPOCHS))
    assert [r["epoch"] for r in rows if "epoch" in r] == list(range(1, EPOCHS + 1))


@pytest.mark.slow
def test_tasks_per_node_without_distributed_environment_is_refused(tmp_path: Path) -> None:
    proc = subprocess.run(
        _command(tmp_path, "+hydra.launcher.tasks_per_node=2"), cwd=ROOT, env=_env(),
        capture_output=True, text=True, timeout=TIMEOUT_S, check=False,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "hydra.launcher.tasks_per_node=2 but no distributed environment" in proc.stderr
    assert not (tmp_path / "metrics.jsonl").exists()
