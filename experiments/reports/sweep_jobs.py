"""A sweep's jobs as read from its folder: each job directory's ``results.json``, Hydra's
``.hydra/overrides.yaml`` and ``metrics.jsonl`` become a ``Job`` (status, final metrics, last
logged values, failure counts and events, the files that could not be read), checked against
its own record (``experiments.reports.sweep_record``); jobs that differ only in the seed are
grouped into a ``Row``. The report built from them: ``experiments.reports.sweep``.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from experiments.engine.results import RESULTS_FILE, ResultsError, read_results
from experiments.reports.sweep_record import check_own_record, read_config

IGNORED_OVERRIDES = ("seed",)
RESULT_NUMBERS = ("train_time_s", "parameters")  # top-level numbers of results.json
NOT_METRICS = ("step", "epoch")  # bookkeeping columns of metrics.jsonl


@dataclass
class Job:
    """One job of a sweep: its overrides, status, final metrics, per-epoch history, failure
    counts by kind (``results.json``'s ``failures.by_kind``), the library's warning events by
    kind (``events.by_kind``), resolved config (results.json's, else Hydra's
    ``.hydra/config.yaml``), the files of it that could not be read (``unreadable``: one
    message per file, naming it), what the failure policy did (``failures.by_action``), the
    last logged value of every ``metrics.jsonl`` key (``logged``), the ``results.json`` as read
    (``record``) and what the checks against its own record changed (``notes``)."""

    directory: Path
    overrides: dict[str, str]
    status: str
    metrics: dict[str, float]
    error: str | None = None
    history: list[dict[str, Any]] = field(default_factory=list)
    failures: dict[str, int] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    events: dict[str, int] = field(default_factory=dict)
    unreadable: list[str] = field(default_factory=list)
    actions: dict[str, int] = field(default_factory=dict)
    logged: dict[str, float | None] = field(default_factory=dict)
    record: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def value(self, metric: str) -> float | None:
        """``metric``'s finite value: results.json's final ``metrics`` (or its top-level
        ``train_time_s`` / ``parameters``) where it records the name, else the last value
        logged in ``metrics.jsonl``; None when absent, null or not finite."""
        recorded = self.record.get("metrics")
        if (isinstance(recorded, Mapping) and metric in recorded) or metric in RESULT_NUMBERS:
            value: Any = self.metrics.get(metric)
        else:
            value = self.logged.get(metric)
        if isinstance(value, (int, float)) and math.isfinite(value):
            return float(value)
        return None

    def metric_names(self) -> set[str]:
        """Every metric name this job recorded (with a value or null)."""
        recorded = self.record.get("metrics")
        names = set(recorded) if isinstance(recorded, Mapping) else set()
        return (names | set(self.metrics) | set(self.logged)) - set(NOT_METRICS)


@dataclass
class Row:
    """One group of jobs (same overrides but the seed)."""

    overrides: dict[str, str]
    jobs: list[Job]

    def values(self, metric: str) -> list[float]:
        """The finite values of ``metric`` over the group's successful jobs (``Job.value``)."""
        values = (job.value(metric) for job in self.jobs if job.status == "ok")
        return [v for v in values if v is not None]

    def missing(self, metric: str) -> int:
        """Successful jobs without a finite value of ``metric`` (absent, null or NaN)."""
        return sum(job.status == "ok" for job in self.jobs) - len(self.values(metric))

    def mean_std(self, metric: str) -> tuple[float, float] | None:
        """(mean, sample std) of ``metric``; std is 0 for one seed; None without values."""
        values = self.values(metric)
        if not values:
            return None
        return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def collect_jobs(sweep_dir: str | Path) -> list[Job]:
    """Every job under ``sweep_dir`` (any depth) that has a results.json or Hydra overrides."""
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        raise FileNotFoundError(
            f"sweep directory {sweep_dir} does not exist; pass the multirun folder that holds "
            "the numbered job directories (e.g. multirun/demo)"
        )
    dirs = {p.parent for p in sweep_dir.rglob(RESULTS_FILE)}
    dirs |= {p.parent.parent for p in sweep_dir.rglob(".hydra/overrides.yaml")}
    jobs = [_read_job(d) for d in sorted(dirs, key=_job_sort_key)]
    if not jobs:
        raise FileNotFoundError(
            f"no jobs (results.json or .hydra/overrides.yaml) under {sweep_dir}"
        )
    return jobs


def group_jobs(jobs: Iterable[Job], ignore: Sequence[str] = IGNORED_OVERRIDES) -> list[Row]:
    """Group jobs by their overrides without the ``ignore`` keys, in first-seen order."""
    rows: dict[tuple[tuple[str, str], ...], Row] = {}
    for job in jobs:
        key_items = {k: v for k, v in job.overrides.items() if k not in ignore}
        key = tuple(sorted(key_items.items()))
        rows.setdefault(key, Row(key_items, [])).jobs.append(job)
    return list(rows.values())


def find_job(sweep_dir: str | Path, **overrides: str) -> Job:
    """The one successful job of ``sweep_dir`` whose overrides include all of ``overrides``
    (values compared as the strings Hydra recorded; a leading ``+`` of a key is ignored).

    Raises:
        LookupError: no job or several jobs match, or the one match did not finish with status
            "ok" (the message lists the candidates' overrides or the job's error).
    """
    wanted = {k.lstrip("+"): str(v) for k, v in overrides.items()}
    jobs = collect_jobs(sweep_dir)
    found = [j for j in jobs if all(j.overrides.get(k) == v for k, v in wanted.items())]
    if len(found) != 1:
        shown = "; ".join(" ".join(f"{k}={v}" for k, v in j.overrides.items()) for j in found[:5])
        raise LookupError(
            f"{len(found)} jobs in {sweep_dir} match {wanted} (need exactly one)"
            + (f": {shown}" if found else "; add or correct the key=value pairs")
        )
    if found[0].status != "ok":
        raise LookupError(
            f"the job matching {wanted} ({found[0].directory}) has status {found[0].status!r}: "
            f"{found[0].error}; rerun the sweep to finish it"
        )
    return found[0]


def _read_job(directory: Path) -> Job:
    unreadable: list[str] = []
    try:
        overrides = _read_overrides(directory / ".hydra" / "overrides.yaml")
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        overrides = {}
        unreadable.append(f"{directory / '.hydra' / 'overrides.yaml'} is not valid YAML ({err})")
    rows = _read_rows(directory / "metrics.jsonl", unreadable)
    history = [row for row in rows if "epoch" in row]
    logged = _last_logged(rows)
    if not (directory / RESULTS_FILE).exists():
        return Job(directory, overrides, "missing", {}, "no results.json (killed or running)",
                   history, unreadable=unreadable, logged=logged)  # fmt: skip
    try:
        results = read_results(directory)
    except ResultsError as err:
        unreadable.append(str(err))
        config = read_config(directory / ".hydra" / "config.yaml")
        return Job(directory, overrides, "unreadable", {}, str(err), history, config=config,
                   unreadable=unreadable, logged=logged)  # fmt: skip
    metrics = {
        k: v for k, v in (results.get("metrics") or {}).items() if isinstance(v, (int, float))
    }
    for key in RESULT_NUMBERS:
        if isinstance(results.get(key), (int, float)) and not isinstance(results[key], bool):
            metrics[key] = results[key]
    failures = (results.get("failures") or {}).get("by_kind") or {}
    actions = (results.get("failures") or {}).get("by_action") or {}
    events = (results.get("events") or {}).get("by_kind") or {}
    job = Job(
        directory,
        overrides,
        results.get("status", "ok"),
        metrics,
        results.get("error"),
        history,
        {str(k): int(v) for k, v in failures.items()},
        results.get("config") or read_config(directory / ".hydra" / "config.yaml"),
        {str(k): int(v) for k, v in events.items()},
        unreadable,
        {str(k): int(v) for k, v in actions.items()},
        logged,
        results,
    )
    if job.status == "ok":
        check_own_record(job)
    return job


def _read_overrides(path: Path) -> dict[str, str]:
    if not path.exists():
        return {}
    items = yaml.safe_load(path.read_text()) or []
    out = {}
    for item in items:
        key, _, value = str(item).partition("=")
        out[key.lstrip("+~")] = value
    return out


def _read_rows(path: Path, unreadable: list[str]) -> list[dict[str, Any]]:
    """The rows of ``metrics.jsonl``; a line that is not a JSON object is skipped and reported
    in ``unreadable`` (by file and line number)."""
    if not path.exists():
        return []
    rows, bad = [], []
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            row = None
        if isinstance(row, dict):
            rows.append(row)
        else:
            bad.append(number)
    if bad:
        unreadable.append(
            f"{path}: line(s) {', '.join(map(str, bad[:10]))} are not JSON objects (skipped; "
            "the job's other rows are reported)"
        )
    return rows


def _last_logged(rows: Sequence[Mapping[str, Any]]) -> dict[str, float | None]:
    """The last logged value of every metric of ``rows`` (None where it is not a number:
    a metric whose last logged value is null counts as missing)."""
    last: dict[str, float | None] = {}
    for row in rows:
        for key, value in row.items():
            if key not in NOT_METRICS:
                last[key] = float(value) if isinstance(value, (int, float)) else None
    return last


def _job_sort_key(path: Path) -> tuple[int, str]:
    return (int(path.name), str(path)) if path.name.isdigit() else (1 << 30, str(path))
