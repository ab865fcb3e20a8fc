"""Turn a multirun directory into a markdown report (mean ± std over seeds) and PNG plots.

Each job directory holds ``results.json`` (written by every job, also by a failed one, with
``status`` and ``error``) and Hydra's ``.hydra/overrides.yaml``. Jobs are grouped by their
overrides minus ``seed``; each group becomes one row. The report is ``templates/sweep.md.j2``
filled by a ``SweepReport``: the metrics (mean ± sample std over seeds; the mean alone for one
seed), what each arm is (the config values that differ between the rows), every job's failure
events by kind (``results.json``'s ``failures`` and the library's warning ``events``), the failed
jobs, and the files that could not be read. One unreadable file (a garbled ``results.json``, a
garbage line in ``metrics.jsonl``) is reported by name; the rest of the sweep is still reported.
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
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

import implicit_ham as ih
from experiments.engine.results import RESULTS_FILE, ResultsError, read_results
from experiments.engine.resume import RUN_SETTINGS
from experiments.reports.render import Table, render
from implicit_ham.nn import decomposition_of
from implicit_ham.reliability import ACTION_MEANINGS, FAILURE_MEANINGS

DEFAULT_METRICS = ("val/miou", "val/blob_acc", "val/pixel_acc", "val/accuracy", "train_time_s")
IGNORED_OVERRIDES = ("seed",)
PLOTTED_METRICS = ("val/blob_acc", "val/miou", "val/accuracy")
# Config keys that never describe an arm (run settings, bookkeeping).
UNDESCRIBED = (*IGNORED_OVERRIDES, *RUN_SETTINGS, "reliability", "study", "checkpoint")
KEY_FIELDS = ("context.name", "adjoint._target_", "solver._target_")
HAM_ONLY = ("adjoint.", "solver.")  # config keys only a ham (a decomposition context) reads


@dataclass
class Job:
    """One job of a sweep: its overrides, status, final metrics, per-epoch history, failure
    counts by kind (``results.json``'s ``failures.by_kind``), the library's warning events by
    kind (``events.by_kind``), resolved config (results.json's, else Hydra's
    ``.hydra/config.yaml``), the files of it that could not be read (``unreadable``: one
    message per file, naming it) and what the failure policy did (``failures.by_action``)."""

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


@dataclass
class Row:
    """One group of jobs (same overrides but the seed)."""

    overrides: dict[str, str]
    jobs: list[Job]

    def values(self, metric: str) -> list[float]:
        """The finite values of ``metric`` over the group's successful jobs."""
        out = []
        for job in self.jobs:
            value = job.metrics.get(metric)
            if job.status == "ok" and isinstance(value, (int, float)) and math.isfinite(value):
                out.append(float(value))
        return out

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


def metrics_table(
    rows: Sequence[Row], metrics: Sequence[str] | None = None, digits: int = 3
) -> Table:
    """One column per swept key, ``n`` (ok / all), then mean ± std per metric (the mean alone
    when one value: no spread from one seed).

    Only metrics present in at least one job are shown (``DEFAULT_METRICS`` by default).
    """
    keys = sorted({k for row in rows for k in row.overrides})
    wanted = metrics or DEFAULT_METRICS
    shown = [m for m in wanted if any(row.values(m) for row in rows)]
    body = []
    for row in rows:
        ok = sum(job.status == "ok" for job in row.jobs)
        cells = [row.overrides.get(k, "") for k in keys] + [f"{ok}/{len(row.jobs)}"]
        for metric in shown:
            stats, n = row.mean_std(metric), len(row.values(metric))
            if stats is None:
                cells.append("–")
            elif n == 1:
                cells.append(f"{stats[0]:.{digits}f}")
            else:
                cells.append(f"{stats[0]:.{digits}f} ± {stats[1]:.{digits}f}")
        body.append(cells)
    return Table.of([*keys, "n", *shown], body)


def failures(jobs: Sequence[Job]) -> Table:
    """The failed jobs with their overrides and error (an empty table when none failed)."""
    body = []
    for job in jobs:
        if job.status == "ok":
            continue
        overrides = " ".join(f"{k}={v}" for k, v in job.overrides.items())
        error = (job.error or job.status).replace("|", "/").replace("\n", " ")[:200]
        body.append([job.directory.name, overrides, error])
    return Table.of(["job", "overrides", "error"], body)


def _flat(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in config.items():
        if not prefix and key in UNDESCRIBED:
            continue
        if isinstance(value, Mapping):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = str(value)
    return out


def arms_table(rows: Sequence[Row]) -> Table:
    """What each row (arm) is, from its jobs' configs: its context, backward mode and solver
    (``KEY_FIELDS``) and every other value that differs between the rows having that key; a
    row whose jobs have no readable config says so."""
    configs = [_flat(next((j.config for j in row.jobs if j.config), {})) for row in rows]
    keys = sorted({k for c in configs for k in c})
    shown = [
        k for k in keys if k in KEY_FIELDS or len({c[k] for c in configs if k in c}) > 1
    ]  # fmt: skip
    body = []
    for row, config in zip(rows, configs, strict=True):
        context = config.get("context.name")
        baseline = context is not None and decomposition_of(context) is None
        used = [k for k in shown if k in config and not (baseline and k.startswith(HAM_ONLY))]
        text = ", ".join(f"{k}={config[k]}" for k in used)
        if baseline and len(used) < len([k for k in shown if k in config]):
            text += f" (adjoint and solver unused: {context} is not a ham)"
        body.append([label(row.overrides), text if config else "(no readable config)"])
    header = "config (context, backward mode, solver; other values where the arms differ)"
    return Table.of(["arm", header], body)


def _counts(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{k}: {n}" for k, n in sorted(counts.items()) if n) or "none"


def failure_counts(jobs: Sequence[Job]) -> Table:
    """Every job's failure events by kind (``results.json``'s ``failures.by_kind``, what the
    failure policy handled), what the policy did with them (``failures.by_action``) and the
    library's warning events by kind (``events.by_kind``)."""
    body = [
        [job.directory.name, label(job.overrides), job.status, _counts(job.failures),
         _counts(job.actions), _counts(job.events)]
        for job in jobs
    ]  # fmt: skip
    header = ["job", "arm", "status", "failure events", "policy action", "warning events"]
    return Table.of(header, body)


def event_meanings(jobs: Sequence[Job]) -> list[tuple[str, str]]:
    """(name, meaning) of every failure kind, policy action and warning class the jobs
    recorded, from the library's own definitions (``ih.reliability.FAILURE_MEANINGS``,
    ``ACTION_MEANINGS`` and the warning classes' docstrings); a name the library does not
    define is listed as such."""
    kinds = sorted({k for job in jobs for k, n in job.failures.items() if n})
    actions = sorted({k for job in jobs for k, n in job.actions.items() if n})
    warned = sorted({k for job in jobs for k, n in job.events.items() if n})
    meanings = [(k, FAILURE_MEANINGS.get(k, "not a failure kind of this library version"))
                for k in kinds]  # fmt: skip
    meanings += [(k, ACTION_MEANINGS.get(k, "not a policy action of this library version"))
                 for k in actions]  # fmt: skip
    for name in warned:
        category = getattr(ih.errors, name, None)  # every warning class of the library
        doc = category.__doc__ if isinstance(category, type) and category.__doc__ else None
        meanings.append((name, " ".join(doc.split()) if doc else "not a warning of the library"))
    return meanings


def unreadable_files(jobs: Sequence[Job]) -> Table:
    """The job files that could not be read (an empty table when all could)."""
    body = [[job.directory.name, problem] for job in jobs for problem in job.unreadable]
    return Table.of(["job", "problem"], body)


@dataclass(frozen=True)
class SweepReport:
    """A sweep's ``report.md``: its title, folder, job count, the metrics table, what each arm
    is, every job's failure counts, the failed jobs, the unreadable files, and (metric, figure
    name) per plotted metric."""

    title: str
    source: Path
    jobs: int
    table: Table
    failures: Table
    plots: tuple[tuple[str, str], ...]
    arms: Table | None = None
    counts: Table | None = None
    unreadable: Table | None = None
    wall_clock: str | None = None
    meanings: tuple[tuple[str, str], ...] = ()


def write_report(
    sweep_dir: str | Path,
    output: str | Path | None = None,
    metrics: Sequence[str] | None = None,
    title: str | None = None,
) -> Path:
    """Write ``report.md`` (table, failures, plots) for ``sweep_dir``; return its path."""
    from experiments.reports.plots import plot_curves, plot_metric_bars

    sweep_dir = Path(sweep_dir)
    out_dir = Path(output) if output is not None else sweep_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    jobs = collect_jobs(sweep_dir)
    rows = group_jobs(jobs)
    plots = []
    for metric in PLOTTED_METRICS:
        if any(row.values(metric) for row in rows):
            name = metric.replace("/", "_")
            plot_metric_bars(rows, metric, out_dir / f"{name}.png")
            plot_curves(rows, metric, out_dir / f"{name}_curves.png")
            plots.append((metric, name))
    report = SweepReport(
        title or "Sweep report", sweep_dir, len(jobs), metrics_table(rows, metrics),
        failures(jobs), tuple(plots), arms_table(rows), failure_counts(jobs),
        unreadable_files(jobs), wall_clock(sweep_dir), tuple(event_meanings(jobs)),
    )  # fmt: skip
    path = out_dir / "report.md"
    path.write_text(render("sweep.md.j2", report=report))
    return path


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


def label(overrides: Mapping[str, str]) -> str:
    """A short label of a row's overrides (``key=value`` joined by spaces)."""
    return " ".join(f"{k.split('.')[-1]}={v}" for k, v in sorted(overrides.items())) or "default"


def _read_job(directory: Path) -> Job:
    unreadable: list[str] = []
    try:
        overrides = _read_overrides(directory / ".hydra" / "overrides.yaml")
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        overrides = {}
        unreadable.append(f"{directory / '.hydra' / 'overrides.yaml'} is not valid YAML ({err})")
    history = _read_history(directory / "metrics.jsonl", unreadable)
    if not (directory / RESULTS_FILE).exists():
        return Job(directory, overrides, "missing", {}, "no results.json (killed or running)",
                   history, unreadable=unreadable)  # fmt: skip
    try:
        results = read_results(directory)
    except ResultsError as err:
        unreadable.append(str(err))
        config = _read_config(directory / ".hydra" / "config.yaml")
        return Job(directory, overrides, "unreadable", {}, str(err), history, config=config,
                   unreadable=unreadable)  # fmt: skip
    metrics = {
        k: v for k, v in (results.get("metrics") or {}).items() if isinstance(v, (int, float))
    }
    for key in ("train_time_s", "parameters"):
        if isinstance(results.get(key), (int, float)):
            metrics[key] = results[key]
    failures = (results.get("failures") or {}).get("by_kind") or {}
    actions = (results.get("failures") or {}).get("by_action") or {}
    events = (results.get("events") or {}).get("by_kind") or {}
    return Job(
        directory,
        overrides,
        results.get("status", "ok"),
        metrics,
        results.get("error"),
        history,
        {str(k): int(v) for k, v in failures.items()},
        results.get("config") or _read_config(directory / ".hydra" / "config.yaml"),
        {str(k): int(v) for k, v in events.items()},
        unreadable,
        {str(k): int(v) for k, v in actions.items()},
    )


def _read_config(path: Path) -> dict[str, Any]:
    """Hydra's saved job config with its interpolations resolved ({} when absent or when an
    interpolation cannot be resolved outside the job): where a results.json without a
    ``config`` falls back to."""
    if not path.exists():
        return {}
    try:
        config = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    except OmegaConfBaseException:
        return {}
    return {str(k): v for k, v in config.items()} if isinstance(config, dict) else {}


def _read_overrides(path: Path) -> dict[str, str]:
    if not path.exists():
        return {}
    items = yaml.safe_load(path.read_text()) or []
    out = {}
    for item in items:
        key, _, value = str(item).partition("=")
        out[key.lstrip("+~")] = value
    return out


def _read_history(path: Path, unreadable: list[str]) -> list[dict[str, Any]]:
    """The epoch rows of ``metrics.jsonl``; a line that is not a JSON object is skipped and
    reported in ``unreadable`` (by file and line number)."""
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
    return [row for row in rows if "epoch" in row]


def _job_sort_key(path: Path) -> tuple[int, str]:
    return (int(path.name), str(path)) if path.name.isdigit() else (1 << 30, str(path))


def wall_clock(sweep_dir: Path) -> str | None:
    """ "<m> min <s> s" from the sweep's start to its last ``results.json`` (``sweep_span_s``),
    with the launcher's parallel jobs when recorded; None without them. What the docs quote as
    the demo's duration: measured by the run, not typed."""
    span = sweep_span_s(sweep_dir)
    if span is None:
        return None
    minutes, seconds = divmod(round(span), 60)
    parallel = parallel_jobs(sweep_dir)
    at_a_time = f", {parallel} jobs at a time" if parallel else ""
    return f"{minutes} min {seconds} s{at_a_time}"


def planned_jobs(sweep_dir: Path) -> int | None:
    """Jobs the sweep in ``sweep_dir`` launches: the product of the sizes of its sweeper's
    comma-separated value lists in Hydra's ``multirun.yaml``; None when the file is absent."""
    path = sweep_dir / "multirun.yaml"
    if not path.exists():
        return None
    hydra = (yaml.safe_load(path.read_text()) or {}).get("hydra") or {}
    params = (hydra.get("sweeper") or {}).get("params") or {}
    return math.prod(len(str(v).split(",")) for v in params.values())


def sweep_span_s(sweep_dir: Path) -> float | None:
    """Wall-clock seconds from the sweep's start (its ``multirun.yaml``) to its last
    ``results.json``; None without them. A sweep resumed later counts the pause too."""
    start = sweep_dir / "multirun.yaml"
    ends = [p.stat().st_mtime for p in sweep_dir.glob("*/results.json")]
    if not start.exists() or not ends:
        return None
    return max(ends) - start.stat().st_mtime


def parallel_jobs(sweep_dir: Path) -> int | None:
    """``hydra.launcher.n_jobs`` of the sweep in ``sweep_dir`` (its ``multirun.yaml``), or None
    when the file or the key is absent."""
    path = sweep_dir / "multirun.yaml"
    if not path.exists():
        return None
    launcher = ((yaml.safe_load(path.read_text()) or {}).get("hydra") or {}).get("launcher")
    return (launcher or {}).get("n_jobs")
