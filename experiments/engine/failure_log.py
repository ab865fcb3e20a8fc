"""Every rank's failure events in one file: ``tables/failures.{jsonl,csv}`` has one writer.

Under torchrun only rank 0 writes the job's files, but every rank's ``FailureMonitor`` sees
events of its own (an implicit backward that misses its tolerance on rank 1's batch). Each
rank's monitor logs into a ``RankFailureLog``: rank 0's rows go straight to its sinks, the other
ranks' are held until ``flush()``, which every rank calls after each training step (before
that step's checkpoint): the held rows are gathered to rank 0, which writes them after its own,
in rank order. Every row carries the ``rank`` that saw it (under torchrun only), so the file
holds every event that ``results.json`` counts, and a checkpoint's row counts cover every
rank's events up to its step (a resume cuts the file back to them, as for any metric file).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from experiments.engine.distributed import DistributedContext
from implicit_ham.diagnostics import Sink
from implicit_ham.reliability.failures import FailureMonitor

logger = logging.getLogger(__name__)

HeldRows = tuple[str, list[dict[str, Any]], int | None]


class RankFailureLog(Sink):
    """The sink a rank's ``FailureMonitor`` logs into (module docstring).

    Args:
        sinks: rank 0's sinks (the job's files); ignored on the other ranks.
        dist: the process group context.
    """

    def __init__(self, sinks: Sequence[Sink], dist: DistributedContext) -> None:
        self.sinks = list(sinks) if dist.is_main else []
        self.dist = dist
        self.held: list[HeldRows] = []

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        """Metric rows go to rank 0's sinks (the other ranks log no metrics)."""
        for sink in self.sinks:
            sink.log(metrics, step)

    def log_table(
        self, name: str, rows: Sequence[Mapping[str, Any]], step: int | None = None
    ) -> None:
        """Rank 0: write ``rows`` now; another rank: hold them for the next ``flush``."""
        tagged = [{**row, "rank": self.dist.rank} if self.dist.enabled else dict(row)
                  for row in rows]  # fmt: skip
        if self.dist.is_main:
            self._write([(name, tagged, step)])
        else:
            self.held.append((name, tagged, step))

    def flush(self) -> None:
        """Gather the rows the other ranks hold and write them on rank 0 (collective: every rank
        calls it at the same step; one all-reduce when no rank holds a row)."""
        if not self.dist.enabled or not self.dist.max_code(len(self.held)):
            return
        gathered = self.dist.gather(self.held)
        self.held = []
        for held in gathered[1:]:
            self._write(held)

    def _write(self, held: Sequence[HeldRows]) -> None:
        for name, rows, step in held:
            for sink in self.sinks:
                sink.log_table(name, rows, step)


def logged_failure_counts(job_dir: str | Path) -> dict[str, Any]:
    """The failure counts of the job's ``tables/failures.jsonl`` as it stands, in the shape of
    the ``failures`` of a finished training run's ``results.json`` (``FailureMonitor.summary``
    plus ``skipped_batches``: the steps with an event whose action is "skipped", which is how a
    batch gets skipped). For the ``results.json`` of a failed run, written after the error,
    when the monitors can no longer be asked: what was logged is what is counted, so the two
    agree."""
    rows = logged_failure_rows(job_dir)
    monitor = FailureMonitor()
    for row in rows:
        monitor.counts[(row["kind"], row["layer"], row["action"])] += 1
    skipped = {row.get("step") for row in rows if row["action"] == "skipped"}
    return {**monitor.summary(), "skipped_batches": len(skipped)}


def logged_failure_rows(job_dir: str | Path) -> list[dict[str, Any]]:
    """The events of the job's ``tables/failures.jsonl`` (each with ``kind``, ``layer`` and
    ``action`` as strings); no file: none. A line that is not an event (a write cut short) is
    left out with a warning naming the file."""
    path = Path(job_dir) / "tables" / "failures.jsonl"
    rows, bad = [], 0
    lines = path.read_text(encoding="utf-8").splitlines() if path.is_file() else []
    for line in filter(str.strip, lines):
        try:
            row = json.loads(line)
            event = {key: str(row[key]) for key in ("kind", "layer", "action")}
        except (json.JSONDecodeError, KeyError, TypeError):
            bad += 1
            continue
        rows.append({**row, **event})
    if bad:
        logger.warning("%s: %d line(s) are not failure events; not counted", path, bad)
    return rows
