"""A study runner stops on SIGTERM: no new job starts, the jobs in flight finish and keep their
rows, and the same command resumes (the shared scheduler and the generation runner)."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from experiments.engine.preemption import PreemptedError
from experiments.studies.generation_v3 import run as generation_run
from experiments.studies.generation_v3.plan import Job as GenerationJob
from experiments.studies.generation_v3.plan import Plan as GenerationPlan
from experiments.studies.job_runner import Schedule, run_schedule


@dataclass(frozen=True)
class Job:
    key: str
    stage: str = "main"
    replicate: int = 0


JOBS = [Job(f"job{k}") for k in range(5)]


def _signal_self(job: Job, target: str, marker: Path) -> dict[str, Any]:
    """A job that sends SIGTERM to the runner (``target``: "self" in process, "parent" from a
    pool worker) when it is job1, then ends ok; job0 ends only after job1 has signalled (so that
    with two workers both are in flight when the signal comes)."""
    if job.key == "job1" and target != "none":
        os.kill(os.getpid() if target == "self" else os.getppid(), signal.SIGTERM)
        marker.touch()
    if job.key == "job0" and target == "parent":
        for _ in range(600):
            if marker.exists():
                break
            time.sleep(0.05)
    return {"status": "ok"}


def _preempted_at(job: Job, key: str) -> dict[str, Any]:
    """A job that ends as a preempted job's row does when it is ``key``."""
    if job.key == key:
        return {"status": "failed", "error": "PreemptedError: preempted by SIGTERM after step 3"}
    return {"status": "ok"}


def _schedule(run: Any, *args: Any) -> Schedule:
    return Schedule(
        pending=lambda rows: [j for j in JOBS if rows.get(j.key, {}).get("status") != "ok"],
        ready=lambda job, done: True,
        order=lambda job: job.key,
        run=run,
        args=args,
        write=lambda rows, row: None,
        session=lambda started, ended, ran: None,
    )


@pytest.mark.parametrize(("workers", "target"), [(1, "self"), (2, "parent")])
def test_a_sigterm_starts_no_new_job_and_the_same_call_resumes(
    workers: int, target: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    rows: dict[str, dict[str, Any]] = {}
    marker, before = tmp_path / "signalled", signal.getsignal(signal.SIGTERM)
    with caplog.at_level(logging.WARNING), pytest.raises(SystemExit) as stopped:
        run_schedule(_schedule(_signal_self, target, marker), rows, workers)
    assert stopped.value.code == 128 + signal.SIGTERM  # a make target's next stage won't start
    assert sorted(rows) == ["job0", "job1"]  # job1's row kept
    assert "3 job(s) not started; run the same command to resume" in caplog.text
    assert signal.getsignal(signal.SIGTERM) is before  # the handler is restored
    counts = run_schedule(_schedule(_signal_self, "none", marker), rows, workers)
    assert counts == {"ran": 3, "failed": 0, "skipped": 2} and sorted(rows) == [j.key for j in JOBS]


def test_a_job_stopped_by_a_signal_stops_the_runner() -> None:
    rows: dict[str, dict[str, Any]] = {}
    with pytest.raises(SystemExit):
        run_schedule(_schedule(_preempted_at, "job2"), rows, workers=1)
    assert sorted(rows) == ["job0", "job1", "job2"] and rows["job2"]["status"] == "failed"
    counts = run_schedule(_schedule(_preempted_at, "none"), rows, workers=1)
    assert counts["ran"] == 3 and all(r["status"] == "ok" for r in rows.values())


def _generation_job(job: GenerationJob, plan: GenerationPlan, out_dir: Path) -> dict[str, Any]:
    if job.key == "self_attention-s0":
        os.kill(os.getpid(), signal.SIGTERM)
    if job.key == "none-s1":
        raise PreemptedError(signal.SIGTERM, 7)
    return {"job": job.key, "plan": plan.pairing_digest(), "status": "ok"}


def test_the_generation_runner_stops_on_a_signal_and_on_a_preempted_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(generation_run, "run_pairing_job", _generation_job)
    plan, results = GenerationPlan(), tmp_path / "pairing.jsonl"
    jobs = plan.pairing_jobs()
    assert [j.key for j in jobs[:2]] == ["none-s0", "self_attention-s0"]
    with pytest.raises(SystemExit):
        generation_run.run_stage("pairing", tmp_path, results, plan)
    assert generation_run.pending(jobs, plan.pairing_digest(), results) == jobs[2:]
    with pytest.raises(SystemExit):
        generation_run.run_stage("pairing", tmp_path, results, plan)  # stops at none-s1, no row
    left = generation_run.pending(jobs, plan.pairing_digest(), results)
    assert left[0].key == "none-s1" and len(left) == len(jobs) - len(plan.arms)


RUNNER = """
import signal, sys, time
from dataclasses import dataclass
from pathlib import Path
from experiments.engine.preemption import PreemptionGuard
from experiments.studies.job_runner import Schedule, run_schedule

marker = Path(sys.argv[1])


@dataclass(frozen=True)
class Job:
    key: str
    stage: str = "main"
    replicate: int = 0


def run(job):
    if job.key == "guarded":  # under its own guard (as the engine's): ends on the first signal
        with PreemptionGuard([signal.SIGTERM]) as guard:
            while not guard.requested():
                time.sleep(0.01)
        marker.write_text("stopped")
        return {"status": "failed", "error": "PreemptedError"}
    (marker.parent / "long").write_text(str(signal.getsignal(signal.SIGTERM)))
    time.sleep(60)  # a job without a guard: it would run on
    return {"status": "ok"}


schedule = Schedule(
    pending=lambda rows: [Job(k) for k in ("guarded", "long") if k not in rows],
    ready=lambda job, done: True, order=lambda job: job.key, run=run, args=(),
    write=lambda rows, row: None, session=lambda started, ended, ran: None,
)
run_schedule(schedule, {}, workers=2)
"""


def test_a_second_signal_to_the_group_leaves_no_pool_worker_behind(tmp_path: Path) -> None:
    """Two SIGTERMs to the process group: the runner exits at once and takes its pool workers
    with it, the one idle since the first signal ended its job included; no worker runs the
    runner's handler (the long job's worker ignores the signals)."""
    script, marker = tmp_path / "runner.py", tmp_path / "stopped"
    script.write_text(RUNNER)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    runner = subprocess.Popen(
        [sys.executable, str(script), str(marker)], env=env, start_new_session=True
    )
    try:
        for _ in range(600):
            if (tmp_path / "long").exists():
                break
            time.sleep(0.05)
        time.sleep(0.5)
        os.killpg(runner.pid, signal.SIGTERM)
        for _ in range(600):
            if marker.exists():
                break
            time.sleep(0.05)
        time.sleep(2.0)  # the runner notices the first signal within a second
        os.killpg(runner.pid, signal.SIGTERM)
        assert runner.wait(timeout=10) == 128 + signal.SIGTERM
        for _ in range(100):
            try:
                os.killpg(runner.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        else:
            pytest.fail("pool workers outlived the runner")
        assert (tmp_path / "long").read_text() == str(signal.SIG_IGN)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(runner.pid, signal.SIGKILL)
