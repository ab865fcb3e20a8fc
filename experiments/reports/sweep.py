"""Turn a multirun directory into a markdown report (mean ± std over seeds) and PNG plots.

The jobs are read by ``experiments.reports.sweep_jobs``; the sweep's size and wall clock by
``experiments.reports.sweep_time``. Each job directory holds ``results.json`` (written by every
job, also by a failed one, with ``status`` and ``error``) and Hydra's ``.hydra/overrides.yaml``.
Jobs are grouped by their overrides minus ``seed``; each group becomes one row, labelled by the
overrides that differ between the rows (those equal in every job are stated once, above the
table). The report is ``templates/sweep.md.j2`` filled by a ``SweepReport``: the metrics (mean ±
sample std over seeds; the mean alone for one seed; an ok job without a value is counted as
missing), each arm's gradient-trust evidence beside its metric
(``experiments.reports.sweep_trust``), what each arm is (the config values that differ between
the rows), every job's failure events by kind (``results.json``'s ``failures`` and the library's
warning ``events``), the failed jobs, and the files that could not be read. One unreadable file
(a garbled ``results.json``, a garbage line in ``metrics.jsonl``) is reported by name; the rest
of the sweep is still reported.

Any metric the jobs recorded can be tabulated: the final ``metrics`` of ``results.json``, its
``train_time_s`` and ``parameters``, and every key of ``metrics.jsonl`` (gradient norms, solver
and backward statistics: their last logged value); an unknown name is an error listing them.

A job's results are checked against its own record of what it trained: an ok ``results.json``
whose config differs from Hydra's ``.hydra/config.yaml`` beside it (a later command rewrote
``.hydra/``) is labelled by the config it trained (or, when an override cannot be mapped to a
config value, reported as ``mislabelled``), and one whose ``logs`` no longer match the metric
files (a later run rewrote them and did not finish) is reported as ``stale``, not ok
(``experiments.reports.sweep_record``). Metric names: ``experiments.reports.sweep_metrics``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import implicit_ham as ih
from experiments.engine.resume import RUN_SETTINGS
from experiments.reports.render import Table, render
from experiments.reports.sweep_jobs import IGNORED_OVERRIDES, Job, Row, collect_jobs, group_jobs
from experiments.reports.sweep_metrics import check_metrics
from experiments.reports.sweep_record import (
    flat_config,
    relabelled_jobs,
)
from experiments.reports.sweep_time import wall_clock
from implicit_ham.nn import decomposition_of
from implicit_ham.reliability import ACTION_MEANINGS, FAILURE_MEANINGS

DEFAULT_METRICS = ("val/miou", "val/blob_acc", "val/pixel_acc", "val/accuracy", "train_time_s")
PLOTTED_METRICS = ("val/blob_acc", "val/miou", "val/accuracy")
# Config keys that never describe an arm (run settings, bookkeeping).
UNDESCRIBED = (*IGNORED_OVERRIDES, *RUN_SETTINGS, "reliability", "study", "checkpoint")
KEY_FIELDS = ("context.name", "adjoint._target_", "solver._target_")
HAM_ONLY = ("adjoint.", "solver.")  # config keys only a ham (a decomposition context) reads


def arm_keys(rows: Sequence[Row]) -> list[str]:
    """The override keys whose value differs between the rows (a key some rows lack differs),
    sorted: what tells the arms apart."""
    keys = sorted({k for row in rows for k in row.overrides})
    return [k for k in keys if len({row.overrides.get(k) for row in rows}) > 1]


def common_overrides(rows: Sequence[Row]) -> dict[str, str]:
    """The overrides every row has with the same value (stated once, above the tables)."""
    varying = set(arm_keys(rows))
    keys = sorted({k for row in rows for k in row.overrides} - varying)
    return {k: rows[0].overrides[k] for k in keys}


def metric_cell(row: Row, metric: str) -> str:
    """mean ± std of ``metric`` over the row's ok jobs (the mean alone for one value); when ok
    jobs lack a value, the count behind the mean and the missing ones: ``(n=2, 1 missing)``."""
    stats, n, missing = row.mean_std(metric), len(row.values(metric)), row.missing(metric)
    if stats is None:
        text = "–"
    elif n == 1:
        text = f"{stats[0]:.3f}"
    else:
        text = f"{stats[0]:.3f} ± {stats[1]:.3f}"
    return f"{text} (n={n}, {missing} missing)" if missing else text


def metrics_table(rows: Sequence[Row], metrics: Sequence[str] | None = None) -> Table:
    """One column per override that differs between the rows (``arm_keys``), ``n`` (ok / all
    jobs), then mean ± std per metric (``metric_cell``).

    ``metrics``: the names to show (each must be recorded by some job: ``check_metrics``);
    by default those of ``DEFAULT_METRICS`` that some job has a value of.
    """
    keys = arm_keys(rows)
    jobs = [job for row in rows for job in row.jobs]
    if metrics:
        shown = check_metrics(metrics, jobs)
    else:
        shown = [m for m in DEFAULT_METRICS if any(row.values(m) for row in rows)]
    body = []
    for row in rows:
        ok = sum(job.status == "ok" for job in row.jobs)
        cells = [row.overrides.get(k, "") for k in keys] + [f"{ok}/{len(row.jobs)}"]
        body.append(cells + [metric_cell(row, m) for m in shown])
    return Table.of([*keys, "n", *shown], body)


def failures(jobs: Sequence[Job], keys: Sequence[str] | None = None) -> Table:
    """The jobs that did not finish ok with their overrides (those in ``keys`` and the seed,
    every one when None), status and error (an empty table when every job is ok)."""
    body = []
    for job in jobs:
        if job.status == "ok":
            continue
        shown = (
            job.overrides
            if keys is None
            else {k: v for k, v in job.overrides.items() if k in keys or k in IGNORED_OVERRIDES}
        )
        overrides = " ".join(f"{k}={v}" for k, v in shown.items())
        error = (job.error or job.status).replace("|", "/").replace("\n", " ")[:400]
        body.append([job.directory.name, overrides, job.status, error])
    return Table.of(["job", "overrides", "status", "error"], body)


def arms_table(rows: Sequence[Row]) -> Table:
    """What each row (arm) is, from its jobs' configs: its context, backward mode and solver
    (``KEY_FIELDS``) and every other value that differs between the rows having that key; a
    row whose jobs have no readable config says so."""
    configs = [
        flat_config(next((j.config for j in row.jobs if j.config), {}), skip=UNDESCRIBED)
        for row in rows
    ]
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
        body.append(
            [label(row.overrides, arm_keys(rows)), text if config else "(no readable config)"]
        )
    header = "config (context, backward mode, solver; other values where the arms differ)"
    return Table.of(["arm", header], body)


def _counts(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{k}: {n}" for k, n in sorted(counts.items()) if n) or "none"


def failure_counts(jobs: Sequence[Job], keys: Sequence[str] | None = None) -> Table:
    """Every job's failure events by kind (``results.json``'s ``failures.by_kind``, what the
    failure policy handled), what the policy did with them (``failures.by_action``) and the
    library's warning events by kind (``events.by_kind``); the arm is labelled by the overrides
    in ``keys`` (every one when None)."""
    body = [
        [job.directory.name, label(job.overrides, keys), job.status, _counts(job.failures),
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
    is, every job's failure counts, the failed jobs, the unreadable files, (metric, figure
    name) per plotted metric, the overrides common to every job, each arm's gradient-trust
    evidence (``experiments.reports.sweep_trust``) and the jobs relabelled from their own
    record."""

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
    common: str = ""
    trust: Table | None = None
    relabelled: Table | None = None


def write_report(
    sweep_dir: str | Path,
    output: str | Path | None = None,
    metrics: Sequence[str] | None = None,
    title: str | None = None,
) -> Path:
    """Write ``report.md`` (table, failures, plots) for ``sweep_dir``; return its path.

    Raises:
        UnknownMetricError: a name of ``metrics`` that no job recorded (``check_metrics``),
            before anything is written.
    """
    from experiments.reports.plots import plot_curves, plot_metric_bars
    from experiments.reports.sweep_trust import trust_table

    sweep_dir = Path(sweep_dir)
    jobs = collect_jobs(sweep_dir)
    rows = group_jobs(jobs)
    table = metrics_table(rows, metrics)  # an unknown metric fails here, before any file
    keys = arm_keys(rows)
    out_dir = Path(output) if output is not None else sweep_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    plots = []
    for metric in PLOTTED_METRICS:
        if any(row.values(metric) for row in rows):
            name = metric.replace("/", "_")
            plot_metric_bars(rows, metric, out_dir / f"{name}.png", keys)
            plot_curves(rows, metric, out_dir / f"{name}_curves.png", keys)
            plots.append((metric, name))
    headline = table.header[len(keys) + 1] if len(table.header) > len(keys) + 1 else None
    common = " ".join(f"{k}={v}" for k, v in common_overrides(rows).items())
    report = SweepReport(
        title or "Sweep report", sweep_dir, len(jobs), table,
        failures(jobs, keys), tuple(plots), arms_table(rows), failure_counts(jobs, keys),
        unreadable_files(jobs), wall_clock(jobs, sweep_dir), tuple(event_meanings(jobs)),
        common, trust_table(rows, keys, headline), relabelled_jobs(jobs),
    )  # fmt: skip
    path = out_dir / "report.md"
    path.write_text(render("sweep.md.j2", report=report))
    return path


def label(overrides: Mapping[str, str], keys: Sequence[str] | None = None) -> str:
    """A short label of a row's overrides: ``key=value`` joined by spaces, for the keys in
    ``keys`` (``arm_keys``: those that tell the arms apart; every key when None), each by the
    last part of its dotted name unless two shown keys share it. "the only arm" when the
    sweep has one (nothing differs), "default" for a job without overrides."""
    shown = sorted(overrides.items()) if keys is None else [
        (k, overrides[k]) for k in sorted(keys) if k in overrides]  # fmt: skip
    if not shown:
        return "default" if not overrides else "the only arm"
    short = [k.split(".")[-1] for k, _ in shown]
    return " ".join(f"{s if short.count(s) == 1 else k}={v}"
                    for s, (k, v) in zip(short, shown, strict=True))  # fmt: skip
