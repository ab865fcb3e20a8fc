"""Which metrics a sweep report can tabulate: every name its jobs recorded (``Job.metric_names``:
the final ``metrics`` of ``results.json``, its ``train_time_s`` / ``parameters``, every key of
``metrics.jsonl``); a name asked for that no job recorded is an error naming the closest ones."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from experiments.reports.sweep_jobs import Job


class UnknownMetricError(ValueError):
    """A metric asked for by name that no job of the sweep recorded (the message lists the
    closest names and every available one)."""


def available_metrics(jobs: Iterable[Job]) -> list[str]:
    """Every metric name the jobs recorded (``Job.metric_names``), sorted."""
    return sorted(set().union(*(job.metric_names() for job in jobs)))


def check_metrics(wanted: Sequence[str], jobs: Sequence[Job]) -> list[str]:
    """``wanted`` when every name is a metric some job recorded; ``UnknownMetricError`` naming
    the unknown ones, the closest recorded names and every available one otherwise."""
    available = available_metrics(jobs)
    unknown = [m for m in wanted if m not in available]
    if unknown:
        hints = []
        for name in unknown:
            close = difflib.get_close_matches(name, available, n=3, cutoff=0.6)
            hints.append(f"{name!r}" + (f" (did you mean {' or '.join(map(repr, close))}?)"
                                         if close else ""))  # fmt: skip
        raise UnknownMetricError(
            f"unknown metric(s) {', '.join(hints)}: no job recorded them. Available (results.json "
            f"metrics, train_time_s / parameters and every metrics.jsonl key): "
            f"{', '.join(available) or 'none'}"
        )
    return list(wanted)
