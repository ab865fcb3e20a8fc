"""The rows of the peer page and what every peer section shares: the row table, the JSON row
format (documented in ``peers.run``), interleaved medians, the same-result
check. Needs only torch, so a section can run in another virtualenv (TorchOpt's, Theseus')."""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch
from torch import Tensor

from experiments.benchmarks.measure import interleaved_samples
from experiments.reports.render import Table as MarkdownTable

COLUMNS = ("target", "case", "peer", "ours_ms", "peer_ms", "ratio", "goal", "met", "notes")


@dataclass
class Table:
    """Rows of the peer table (one dict per measured case)."""

    rows: list[dict[str, object]] = field(default_factory=list)

    def add(self, target: str, case: str, peer: str, ours: float, theirs: float, goal: float,
            notes: str = "", floor: float | None = None) -> None:
        """A timed case: ratio = peer / ours, met when ``>= goal``."""
        ratio = theirs / ours
        row: dict[str, object] = {
            "target": target, "case": case, "peer": peer, "ours_ms": ours, "peer_ms": theirs,
            "ratio": ratio, "goal": f">= {goal:g}", "met": "yes" if ratio >= goal else "no",
            "notes": notes,
        }  # fmt: skip
        if floor is not None:
            row["floor_ms"] = floor
        self._spread(row, theirs, ours)
        self.rows.append(row)

    def add_at_most(self, target: str, case: str, peer: str, ours: float, theirs: float,
                    goal: float, notes: str = "") -> None:
        """A cost where less is better compared as ours / peer (memory, overhead), met when
        ``<= goal``."""
        ratio = ours / theirs
        row: dict[str, object] = {
            "target": target, "case": case, "peer": peer, "ours_ms": ours, "peer_ms": theirs,
            "ratio": ratio, "goal": f"<= {goal:g}", "met": "yes" if ratio <= goal else "no",
            "notes": notes,
        }  # fmt: skip
        self._spread(row, ours, theirs)
        self.rows.append(row)

    @staticmethod
    def _spread(row: dict[str, object], top: float, bottom: float) -> None:
        """Add ``ratio_iqr`` (the quartiles of the per-round ratios) where the row's two times
        are ``Timing``s of one interleaved measurement."""
        quartiles = round_ratio_quartiles(top, bottom)
        if quartiles is not None:
            row["ratio_iqr"] = quartiles

    def as_table(self) -> MarkdownTable:
        """The rows in ``COLUMNS`` order, for the markdown writer."""
        return MarkdownTable.of(COLUMNS, ([row[c] for c in COLUMNS] for row in self.rows))

    def markdown(self) -> str:
        """The table as markdown (floats to 4 significant digits)."""
        return self.as_table().markdown()


def write_json(path: str | Path, section: str, table: Table, meta: Mapping[str, object]) -> Path:
    """Write one section's rows in the JSON row format (module docstring)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"section": section, "meta": dict(meta), "rows": table.rows}
    path.write_text(json.dumps(payload, indent=1, default=float) + "\n")
    return path


def read_json(path: str | Path) -> dict[str, Any]:
    """One section file; ValueError naming the file when a row lacks a ``COLUMNS`` key."""
    payload = cast(dict[str, Any], json.loads(Path(path).read_text()))
    for row in payload.get("rows", []):
        missing = [c for c in COLUMNS if c not in row]
        if missing:
            raise ValueError(f"{path}: a row lacks {missing}; see the format in peers.py")
    return payload


def run_meta(command: str, threads: int, clock: str, rounds: int) -> dict[str, object]:
    """The set-up a section records: command, torch, threads, clock, rounds, the host's load
    and processor."""
    load = " ".join(f"{v:.2f}" for v in os.getloadavg())
    return {"command": command, "torch": torch.__version__, "threads": threads, "clock": clock,
            "rounds": rounds, "load": f"load average {load}", "python": sys.executable,
            "cpu": cpu_model()}


def cpu_model() -> str:
    """The processor's model name (``/proc/cpuinfo``; ``platform.processor()`` elsewhere)."""
    info = Path("/proc/cpuinfo")
    if info.exists():
        for line in info.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def check_same(what: str, ours: Sequence[Tensor], theirs: Sequence[Tensor], tol: float) -> float:
    """The largest relative difference of the pairs; SystemExit naming ``what`` above ``tol``
    (the two sides must compute the same thing before they are timed)."""
    worst = 0.0
    for a, b in zip(ours, theirs, strict=True):
        diff = float((a.detach().double() - b.detach().double()).norm())
        worst = max(worst, diff / max(float(b.detach().double().norm()), 1e-30))
    if not worst <= tol:
        raise SystemExit(f"peers: {what}: the two sides differ by {worst:.2e} > {tol:g}")
    return worst


CLOCK = {"cpu": time.process_time, "wall": time.perf_counter}
_clock = [time.process_time]


class Timing(float):
    """A median time (milliseconds) that keeps the rounds it is the median of, in round order,
    and the measurement they came from (``medians``: one call, its cases interleaved), so that a
    row can show how the per-round ratio of two cases of one measurement spreads."""

    samples: tuple[float, ...]
    measurement: object

    def __new__(cls, samples: Sequence[float], measurement: object) -> Timing:
        timing = super().__new__(cls, statistics.median(samples))
        timing.samples, timing.measurement = tuple(samples), measurement
        return timing


def round_ratio_quartiles(top: float, bottom: float) -> list[float] | None:
    """The first and third quartiles of the per-round ratios ``top_i / bottom_i`` when both are
    ``Timing``s of one ``medians`` call (each round ran the two back to back) with at least 4
    rounds; None otherwise (times measured apart, or a cost that is not a time)."""
    if not (isinstance(top, Timing) and isinstance(bottom, Timing)):
        return None
    if top.measurement is not bottom.measurement or len(top.samples) < 4:
        return None
    ratios = [a / b for a, b in zip(top.samples, bottom.samples, strict=True)]
    first, _, third = statistics.quantiles(ratios, n=4)
    return [first, third]


def medians(
    cases: Mapping[str, Callable[[], object]], rounds: int, warmup: int = 2
) -> dict[str, Timing]:
    """Median milliseconds of each case over ``rounds`` interleaved rounds (``--clock``: the
    process CPU time by default, which on a shared host does not count the time other jobs
    hold the core); each a ``Timing`` that keeps its rounds."""
    samples = interleaved_samples(cases, torch.device("cpu"), rounds, warmup, _clock[0])
    measurement = object()
    return {name: Timing(values, measurement) for name, values in samples.items()}
