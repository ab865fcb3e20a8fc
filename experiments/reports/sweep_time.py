"""A sweep's size and time, read from its folder: the jobs it plans and runs at a time (Hydra's
``multirun.yaml``) and its wall-clock span (its jobs' ``results.json``).

The span is the time during which at least one of the sweep's finished jobs was training: the
union of the jobs' intervals, each ending at its ``results.json``'s modification time and
lasting its ``train_time_s``. It holds for a sweep stopped and resumed: jobs finished by an
earlier invocation keep their intervals, and a pause between invocations during which no job
was in flight is not counted. (Hydra rewrites ``multirun.yaml`` on every invocation, so the
span from that file to the last result was negative for a resumed sweep whose jobs had all
finished before.) It is an approximation in three ways: process start-up, imports and data
building outside a job's training are not counted; failed, preempted and killed jobs record
no training time and are not counted; and a job resumed from its checkpoint counts its
earlier segments as if they ran just before its last one, so the span can exceed the true one
by at most those earlier segments (which may fall inside the pause).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path

import yaml

from experiments.engine.results import RESULTS_FILE
from experiments.reports.sweep_jobs import Job

SWEEP_FILE = "multirun.yaml"


def planned_jobs(sweep_dir: Path) -> int | None:
    """Jobs the sweep in ``sweep_dir`` launches: the product of the sizes of its sweeper's
    comma-separated value lists in Hydra's ``multirun.yaml``; None when the file is absent."""
    path = sweep_dir / SWEEP_FILE
    if not path.exists():
        return None
    hydra = (yaml.safe_load(path.read_text()) or {}).get("hydra") or {}
    params = (hydra.get("sweeper") or {}).get("params") or {}
    return math.prod(len(str(v).split(",")) for v in params.values())


def parallel_jobs(sweep_dir: Path) -> int | None:
    """``hydra.launcher.n_jobs`` of the sweep in ``sweep_dir`` (its ``multirun.yaml``), or None
    when the file or the key is absent."""
    path = sweep_dir / SWEEP_FILE
    if not path.exists():
        return None
    launcher = ((yaml.safe_load(path.read_text()) or {}).get("hydra") or {}).get("launcher")
    return (launcher or {}).get("n_jobs")


def job_intervals(jobs: Iterable[Job]) -> list[tuple[float, float]]:
    """(start, end) in epoch seconds of each ok job of ``jobs`` with a finite, non-negative
    ``train_time_s`` (``Job.value``): end is its ``results.json``'s modification time, start is
    end minus that time. Other jobs (failed, preempted, unreadable) are left out."""
    intervals = []
    for job in jobs:
        seconds = job.value("train_time_s") if job.status == "ok" else None
        if seconds is not None and seconds >= 0:
            end = (job.directory / RESULTS_FILE).stat().st_mtime
            intervals.append((end - seconds, end))
    return intervals


def union_seconds(intervals: Iterable[tuple[float, float]]) -> float:
    """Length of the union of the (start, end) ``intervals``: overlapping ones count once."""
    total, reach = 0.0, -math.inf
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def sweep_span_s(jobs: Iterable[Job]) -> float | None:
    """Wall-clock seconds during which at least one of a sweep's ``jobs`` trained (the union
    of ``job_intervals``); None when no job recorded its training time."""
    intervals = job_intervals(jobs)
    return union_seconds(intervals) if intervals else None


def wall_clock(jobs: Iterable[Job], sweep_dir: Path) -> str | None:
    """ "<m> min <s> s" of ``sweep_span_s(jobs)`` (the time while the sweep's jobs trained, not
    the command's duration), with the launcher's parallel jobs (``sweep_dir``'s
    ``multirun.yaml``) when recorded; None without a job's time. Measured by the run, not typed:
    the sweep report quotes it."""
    span = sweep_span_s(jobs)
    if span is None:
        return None
    minutes, seconds = divmod(round(span), 60)
    parallel = parallel_jobs(sweep_dir)
    at_a_time = f", {parallel} jobs at a time" if parallel else ""
    return f"{minutes} min {seconds} s{at_a_time}"
