"""The stress test's per-job rows: one CSV row per sweep job (its arm, seed, status, final
metrics, training time and the SHA-256 of its trained parameters), written beside the page
(``docs/results/legend_seg_jobs.csv``) each time the report runs, so that the runs themselves
need not be committed and a later run, on this machine or another, can be compared with them.

``python -m experiments.studies.legend_seg.job_rows RUNS [--rows CSV]`` compares the study
folder ``RUNS`` with committed rows: per job, whether its parameters are bit-identical and how
far its metrics moved. A row's ``cpu`` and ``commit`` are those its job recorded at its end
(``results.json``'s ``host``); a job run before jobs recorded them takes those of the process
that writes the rows.
"""

from __future__ import annotations

import argparse
import csv
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from experiments.engine.provenance import cpu_model, library_commit
from experiments.engine.resume import RUN_SETTINGS
from experiments.reports.sweep_jobs import IGNORED_OVERRIDES, Job
from experiments.studies.legend_seg.data import SWEEPS, StudyRuns, load_study

logger = logging.getLogger(__name__)

ROWS_FILE = "legend_seg_jobs.csv"
METRICS = ("val/miou", "val/blob_acc")
FIELDS = ("sweep", "arm", "seed", "status", *METRICS, "train_time_s", "state_digest", "cpu",
          "commit")  # fmt: skip


def job_rows(runs: StudyRuns) -> list[dict[str, str]]:
    """One row per job of the stress test's sweeps, in sweep then job order."""
    cpu, commit = cpu_model(), library_commit()
    return [_row(name, job, cpu, commit) for name in SWEEPS
            for job in runs.sweeps.get(name, [])]  # fmt: skip


def _row(sweep: str, job: Job, cpu: str, commit: str) -> dict[str, str]:
    digests = job.record.get("state_digests") or [""]
    recorded = job.record.get("host") or {}
    values = {m: job.value(m) for m in (*METRICS, "train_time_s")}
    return {
        "sweep": sweep,
        "arm": _arm(job),
        "seed": job.overrides.get("seed", ""),
        "status": job.status,
        **{m: "" if v is None else repr(v) for m, v in values.items()},
        "state_digest": str(digests[0]),
        "cpu": str(recorded.get("cpu", cpu)),
        "commit": str(recorded.get("commit", commit)),
    }


def _arm(job: Job) -> str:
    """The job's overrides but the seed, the experiment preset and the run settings (threads,
    progress, logging: they change no number), sorted: its arm."""
    skipped = (*IGNORED_OVERRIDES, *RUN_SETTINGS, "experiment")
    items = sorted((k, v) for k, v in job.overrides.items() if k not in skipped)
    return " ".join(f"{k}={v}" for k, v in items)


def write_rows(runs: StudyRuns, path: Path) -> Path:
    """Write ``job_rows(runs)`` to ``path`` (CSV, header ``FIELDS``)."""
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, FIELDS)
        writer.writeheader()
        writer.writerows(job_rows(runs))
    return path


def read_rows(path: Path) -> list[dict[str, str]]:
    """The rows of a ``write_rows`` CSV."""
    with path.open(newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


@dataclass(frozen=True)
class Comparison:
    """A run against committed rows. ``both``: jobs ok on both sides; ``identical``: those of
    them with bit-identical parameters; ``largest``: each metric's largest absolute change over
    them (None without a job on both sides); ``unmatched``: those of them with a metric present
    on one side only; ``not_ok``: jobs on both sides that are not ok on one of them;
    ``only_run`` / ``only_rows``: jobs on one side only."""

    both: int
    identical: int
    largest: dict[str, float | None]
    unmatched: int
    not_ok: int
    only_run: int
    only_rows: int


Key = tuple[str, str, str]


def _keyed(items: Iterable[Mapping[str, str]], side: str) -> dict[Key, Mapping[str, str]]:
    out: dict[Key, Mapping[str, str]] = {}
    for row in items:
        key = (row["sweep"], row["arm"], row["seed"])
        if key in out:
            raise ValueError(f"two jobs of the {side} are {key} (sweep, arm, seed): the rows "
                             "must name each job once; re-write them from one study folder")
        out[key] = row
    return out


def compare(run: Iterable[Mapping[str, str]], rows: Iterable[Mapping[str, str]]) -> Comparison:
    """Match the jobs of ``run`` and ``rows`` by (sweep, arm, seed). Raises ValueError when a
    side names a job twice."""
    mine, theirs = _keyed(run, "run"), _keyed(rows, "rows")
    common = sorted(mine.keys() & theirs.keys())
    ok = [k for k in common if mine[k]["status"] == theirs[k]["status"] == "ok"]
    largest: dict[str, float | None] = {}
    for metric in METRICS:
        pairs = [(mine[k][metric], theirs[k][metric]) for k in ok]
        changes = [abs(float(a) - float(b)) for a, b in pairs if a and b]
        largest[metric] = max(changes) if changes else None
    return Comparison(
        both=len(ok),
        identical=sum(mine[k]["state_digest"] == theirs[k]["state_digest"] != "" for k in ok),
        largest=largest,
        unmatched=sum(any(bool(mine[k][m]) != bool(theirs[k][m]) for m in METRICS) for k in ok),
        not_ok=len(common) - len(ok),
        only_run=len(mine.keys() - theirs.keys()),
        only_rows=len(theirs.keys() - mine.keys()),
    )


def describe(result: Comparison, rows: Sequence[Mapping[str, str]]) -> str:
    """One paragraph: the comparison's numbers and where the committed rows were written."""
    hosts = sorted({f"{r['cpu']} at {r['commit']}" for r in rows})
    moved = ", ".join(f"{m} {'n/a' if v is None else f'{v:.3g}'}"
                      for m, v in result.largest.items())  # fmt: skip
    return (
        f"{result.identical} of {result.both} jobs ok in both have bit-identical parameters; "
        f"largest absolute metric change: {moved}; {result.unmatched} with a metric on one side "
        f"only; {result.not_ok} not ok on one side; {result.only_run} job(s) only in the run, "
        f"{result.only_rows} only in the rows (rows written on {'; '.join(hosts)})."
    )


def main(argv: Sequence[str] | None = None) -> None:
    """The command: log ``describe`` of the study folder against the rows; exit 1 when no job
    is ok on both sides (nothing was compared)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", help="the study folder (make study-stress's multirun/study)")
    parser.add_argument("--rows", default=f"docs/results/{ROWS_FILE}", help="committed rows")
    args = parser.parse_args(argv)
    rows = read_rows(Path(args.rows))
    result = compare(job_rows(load_study(args.runs)), rows)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logger.info("%s", describe(result, rows))
    if result.both == 0:
        raise SystemExit(f"no job is ok in both {args.runs} and {args.rows}: nothing compared")


if __name__ == "__main__":
    main()
