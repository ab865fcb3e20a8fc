"""The resumable job scheduler of the studies that commit one CSV row per job (study v4, the
sequence benchmarks): run every pending job, ``workers`` at a time, and write each job's row to
the study's CSV as it ends.

A study supplies its jobs (anything with ``key``, ``stage``, ``replicate``), a picklable
``run(job, *args) -> row`` (a row with ``status``), which jobs are still pending given the
rows, when a job is ready (its replicate's backbone exists) and the order in which ready jobs
start. A job whose row says ``ok`` is never run again, so the study resumes from the committed
CSV alone; a failed job is retried only by the next invocation.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

Row = dict[str, Any]


@dataclass(frozen=True)
class Schedule:
    """A study's side of the scheduler.

    Attributes:
        pending: rows -> the jobs still to run (in any order).
        ready: (job, replicates whose pretraining ended ok in this invocation) -> may it start.
        order: the sort key of ready jobs (smallest first).
        run: runs one job in a worker process, ``run(job, *args) -> row``; module-level
            (picklable).
        args: the rest of ``run``'s arguments (picklable).
        write: rewrites the CSV from all rows (job key -> row).
        session: called once at the end when jobs ran, with (started, finished, jobs run).
    """

    pending: Callable[[Mapping[str, Row]], list[Any]]
    ready: Callable[[Any, set[int]], bool]
    order: Callable[[Any], Any]
    run: Callable[..., Row]
    args: tuple[Any, ...]
    write: Callable[[Mapping[str, Row]], None]
    session: Callable[[float, float, int], None]


def run_schedule(schedule: Schedule, rows: dict[str, Row], workers: int = 2) -> dict[str, int]:
    """Run every pending job, ``workers`` at a time (1: in this process), updating ``rows``
    and writing them as each job ends. Returns counts: ran, failed, skipped (ok at start)."""
    started = time.time()
    settled: set[str] = set()  # this invocation's settled jobs
    settled_pretrain: set[int] = set()
    counts = {"ran": 0, "failed": 0, "skipped": 0}
    skipped_at_start = {k for k, r in rows.items() if r.get("status") == "ok"}
    pool = ProcessPoolExecutor(max_workers=workers) if workers > 1 else None
    running: dict[Future[Row], Any] = {}

    def record(job: Any, row: Row) -> None:
        rows[job.key] = row
        settled.add(job.key)
        if job.stage == "pretrain" and row["status"] == "ok":
            settled_pretrain.add(job.replicate)
        counts["ran"] += 1
        counts["failed"] += row["status"] != "ok"
        schedule.write(rows)
        logger.info("%s: %s (%d ran)", job.key, row["status"], counts["ran"])

    try:
        while True:
            in_flight = {j.key for j in running.values()}
            todo = [j for j in schedule.pending(rows)
                    if j.key not in settled and j.key not in in_flight]  # fmt: skip
            ready = sorted(
                (j for j in todo if schedule.ready(j, settled_pretrain)), key=schedule.order
            )
            if not ready and not running:
                break
            if pool is None:
                if not ready:
                    break
                record(ready[0], schedule.run(ready[0], *schedule.args))
                continue
            for job in ready[: max(workers - len(running), 0)]:
                running[pool.submit(schedule.run, job, *schedule.args)] = job
            done, _ = wait(list(running), return_when=FIRST_COMPLETED)
            for future in done:
                record(running.pop(future), future.result())
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
        counts["skipped"] = len(skipped_at_start)
        if counts["ran"]:
            schedule.session(started, time.time(), counts["ran"])
    return counts
