"""The resumable job scheduler of the studies that commit one row per job (study v4, the
sequence benchmarks, generation v3, the DEQ study): run every pending job, ``workers`` at a
time, and write each job's row to the study's results file as it ends.

A study supplies its jobs (anything with a ``key``), a picklable ``run(job, *args) -> row``
(a row with ``status``, or without one for ok), which jobs are still pending given the rows,
how a row is stored, and optionally when a job is ready (study v4: its replicate's backbone
exists) and the order in which ready jobs start. A job whose row says ``ok`` is never run
again, so the study resumes from the committed file alone; a failed job is retried only by the
next invocation.

A runner stops on SIGTERM or SIGINT (``StopRequest``): it starts no new job, waits for the jobs
in flight (a job that got the signal too, as ``kill -- -PGID`` sends it to the whole group,
checkpoints at its next step and ends ``PreemptedError``; the engine's own guard handles it
there) and logs how many jobs did not start; a job stopped that way also stops the runner. A
second signal exits at once and kills the pool's workers, idle or not. The workers themselves
ignore both signals between jobs (``worker_pool``), so a signal to the process group neither
ends an idle worker nor runs the runner's handler in it. The same command resumes.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import time
import types
from collections.abc import Callable, Collection, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

from experiments.engine.preemption import PreemptionGuard

logger = logging.getLogger(__name__)

Row = dict[str, Any]


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopRequest(PreemptionGuard):
    """A study runner's guard over SIGTERM and SIGINT: the first one asks the runner to start
    no new job (``requested``); a second kills this process's child processes (the pool's
    workers) and exits at once."""

    def __init__(self) -> None:
        super().__init__(STOP_SIGNALS)

    def _handle(self, signum: int, frame: types.FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.signum is not None:
            logger.error("second %s: exiting now", name)
            for child in multiprocessing.active_children():
                child.kill()
            os._exit(128 + signum)
        self.signum = signum
        logger.warning("received %s: starting no new job, waiting for those in flight; send "
                       "it again to exit at once", name)  # fmt: skip

    def __enter__(self) -> StopRequest:
        super().__enter__()
        return self

    def stop(self, row: Mapping[str, Any]) -> bool:
        """Whether to start no new job after ``row``: a signal arrived, or ``row``'s job was
        stopped by one (its error names ``PreemptedError`` or ``KeyboardInterrupt``)."""
        error = str(row.get("error") or "")
        return self.requested() or error.startswith(("PreemptedError", "KeyboardInterrupt"))

    def report(self, not_started: int) -> None:
        """When the runner stopped with ``not_started`` jobs left: log how many and how to
        resume, and exit with 128 + the signal's number (SIGTERM's when only a job's own guard
        saw it), as a stopped job does, so that the next stage of a ``make`` target does not
        start."""
        if not_started:
            logger.warning("stopped: %d job(s) not started; run the same command to resume",
                           not_started)  # fmt: skip
            raise SystemExit(128 + (self.signum or signal.SIGTERM))


def _ignore_stop_signals() -> None:
    """A pool worker's initializer: SIGTERM and SIGINT are the runner's to act on. A job's own
    guard (the engine's ``preemptible``) takes them while it runs and restores this after."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


def worker_pool(workers: int) -> ProcessPoolExecutor | None:
    """The runner's pool of ``workers`` processes that ignore the stop signals between jobs
    (None for 1: jobs run in the runner's process)."""
    return (
        ProcessPoolExecutor(max_workers=workers, initializer=_ignore_stop_signals)
        if workers > 1
        else None
    )


def wait_first(running: Collection[Future[Any]]) -> set[Future[Any]]:
    """Wait until one of ``running`` ends; returns those done. It wakes every second, as the
    runner's signal handler runs only when its main thread does (a signal the kernel hands to
    the pool's manager thread would otherwise wait for the next job to end)."""
    done: set[Future[Any]] = set()
    while not done:
        done, _ = wait(running, timeout=1.0, return_when=FIRST_COMPLETED)
    return done


@dataclass(frozen=True)
class Schedule:
    """A study's side of the scheduler.

    Attributes:
        pending: rows -> the jobs still to run (anything with a ``key``), in any order.
        run: runs one job in a worker process, ``run(job, *args) -> row``; module-level
            (picklable). A row without ``status`` counts as ok.
        args: the rest of ``run``'s arguments (picklable).
        write: (all rows by job key, the row that just ended) -> stores it (rewrites the CSV,
            or appends the row).
        ready: (job, the rows of the jobs that ended in this invocation) -> may it start
            (default: always).
        order: the sort key of ready jobs, smallest first (default: ``pending``'s order, as
            the sort is stable).
        session: called once at the end when jobs ran, with (started, finished, jobs run)
            (default: nothing).
    """

    pending: Callable[[Mapping[str, Row]], list[Any]]
    run: Callable[..., Row]
    args: tuple[Any, ...]
    write: Callable[[Mapping[str, Row], Row], None]
    ready: Callable[[Any, Mapping[str, Row]], bool] = lambda job, settled: True
    order: Callable[[Any], Any] = lambda job: 0
    session: Callable[[float, float, int], None] = lambda started, finished, ran: None


def run_schedule(schedule: Schedule, rows: dict[str, Row], workers: int = 2) -> dict[str, int]:
    """Run every pending job, ``workers`` at a time (1: in this process), updating ``rows``
    and writing them as each job ends. Returns counts: ran, failed, skipped (ok at start)."""
    started = time.time()
    settled: dict[str, Row] = {}  # this invocation's ended jobs
    counts = {"ran": 0, "failed": 0, "skipped": 0}
    skipped_at_start = {k for k, r in rows.items() if r.get("status") == "ok"}
    pool = worker_pool(workers)
    running: dict[Future[Row], Any] = {}

    def record(job: Any, row: Row) -> None:
        rows[job.key] = settled[job.key] = row
        counts["ran"] += 1
        counts["failed"] += row.get("status", "ok") != "ok"
        schedule.write(rows, row)
        logger.info("%s: %s (%d ran)", job.key, row.get("status", "ok"), counts["ran"])

    stopping = False
    with StopRequest() as guard:
        try:
            while True:
                in_flight = {j.key for j in running.values()}
                todo = [j for j in schedule.pending(rows)
                        if j.key not in settled and j.key not in in_flight]  # fmt: skip
                stopping = stopping or guard.requested()
                ready = (
                    []
                    if stopping
                    else sorted((j for j in todo if schedule.ready(j, settled)), key=schedule.order)
                )
                if not ready and not running:
                    break
                if pool is None:
                    record(ready[0], schedule.run(ready[0], *schedule.args))
                    stopping = guard.stop(rows[ready[0].key])
                    continue
                for job in ready[: max(workers - len(running), 0)]:
                    running[pool.submit(schedule.run, job, *schedule.args)] = job
                for future in wait_first(list(running)):
                    job = running.pop(future)
                    record(job, future.result())
                    stopping = stopping or guard.stop(rows[job.key])
        finally:
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)
            counts["skipped"] = len(skipped_at_start)
            if counts["ran"]:
                schedule.session(started, time.time(), counts["ran"])
        if stopping:
            guard.report(len([j for j in schedule.pending(rows) if j.key not in settled]))
    return counts
