"""The run outputs of the study behind ``docs/results.md``, read from one study folder.

Layout (what ``experiments/scripts/study.sh`` writes under ``multirun/study``)::

    adjoints/<n>/       experiments.train, +experiment=adjoint_ablation (question 1)
    context/<n>/        experiments.train, +experiment=attention_vs_md (question 3)
    remedy/<n>/         experiments.train, +experiment=study_remedy (question 2)
    legend_probe/<n>/   experiments.train, +experiment=legend_probe (the dD/dX probe)
    paper_<finetune|frozen|adamw>/<n>/   experiments.train, +experiment=paper_* (paper regime)
    pretrain/backbone.pt                 experiments.pretrain (the paper regime's backbone)
    grad_paper/<init|trained>_<context>/ experiments.grad_study on the paper regime
    grad/<init|trained>_<context>/         experiments.grad_study (question 2)
    convergence/<init|trained>_<context>/  experiments.convergence (question 4)
    bench.json          experiments.bench --json (question 3's compute table)

Every part is optional: the document says which are missing instead of failing.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from experiments.engine.results import RESULTS_FILE, read_results
from experiments.reports.sweep import Job, Row, collect_jobs, group_jobs, planned_jobs
from implicit_ham.diagnostics.table import format_value

CONTEXTS = ("nmf", "vq", "cd")
ADJOINTS = ("unroll", "one_step", "implicit", "phantom")
KS = (1, 3, 6, 12)
METRICS = ("val/blob_acc", "val/miou")
REFERENCE_K = 6  # the paper's K, where the document compares modes
PAPER_SWEEPS = (
    "paper_finetune",
    "paper_frozen",
    "paper_adamw",
)  # experiments/scripts/study_paper.sh
LEGEND_SWEEPS = ("adjoints", "context", "remedy", "legend_probe")
SWEEPS = (*LEGEND_SWEEPS, *PAPER_SWEEPS)
STUDIES = ("grad", "convergence", "grad_paper")
EXPECTED_STUDIES = {  # what experiments/scripts/study.sh runs
    "grad": (*(f"init_{c}" for c in ("nmf", "vq", "cd", "nmf_normalized")),
             *(f"trained_{c}" for c in ("nmf", "vq", "cd"))),
    "convergence": tuple(f"{p}_{c}" for p in ("init", "trained") for c in ("nmf", "vq", "cd")),
    "grad_paper": tuple(f"{p}_{c}" for p in ("init", "trained") for c in ("nmf", "vq", "cd")),
}  # fmt: skip


@dataclass
class StudyRuns:
    """Everything the study produced: sweep jobs, no-training study results, benchmark tables.

    Attributes:
        root: the study folder.
        sweeps: sweep name -> its jobs (empty when the sweep folder is missing).
        studies: "grad" / "convergence" -> {"<init|trained>_<context>": results.json content}.
        bench: the benchmark's JSON tables, or None.
    """

    root: Path
    sweeps: dict[str, list[Job]] = field(default_factory=dict)
    studies: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    bench: dict[str, Any] | None = None

    def rows(self, sweep: str) -> list[Row]:
        """The sweep's jobs grouped over seeds."""
        return group_jobs(self.sweeps.get(sweep, []))

    def study(self, kind: str, point: str, context: str) -> dict[str, Any] | None:
        """The results of one no-training study (``point`` "init" or "trained"), or None."""
        return self.studies.get(kind, {}).get(f"{point}_{context}")

    def missing(self) -> list[str]:
        """Parts of the study that produced nothing (for the document's status line): empty
        sweeps, each expected no-training study without results, the benchmark."""
        out = [f"sweep `{name}`" for name in SWEEPS if not self.sweeps.get(name)]
        for name in LEGEND_SWEEPS:  # the paper sweeps' unfinished jobs: PaperRegimeSection
            jobs = self.sweeps.get(name) or []
            ok = sum(job.status == "ok" for job in jobs)
            expected = max(planned_jobs(self.root / name) or len(jobs), len(jobs))
            if jobs and ok < expected:
                out.append(f"{expected - ok}/{expected} jobs of `{name}`")
        for kind, names in EXPECTED_STUDIES.items():
            out += [f"`{kind}/{name}`" for name in names if name not in self.studies.get(kind, {})]
        return out + ([] if self.bench is not None else ["`bench.json`"])

    def parallel_jobs(self, sweep: str) -> int | None:
        """``hydra.launcher.n_jobs`` of a sweep (from its multirun.yaml), or None."""
        path = self.root / sweep / "multirun.yaml"
        if not path.exists():
            return None
        launcher = ((yaml.safe_load(path.read_text()) or {}).get("hydra") or {}).get("launcher")
        return (launcher or {}).get("n_jobs")


class DocBase:
    """What every section of the study document shares: the runs, where figures go, and the
    summary lines the sections' verdicts add."""

    def __init__(self, runs: StudyRuns, out_dir: Path, figures: str) -> None:
        self.runs, self.out_dir, self.figures = runs, out_dir, figures
        self.adjoint_rows = runs.rows("adjoints")
        self.summary: list[str] = []  # one line per verdict, for the Summary section

    def figure(self, name: str) -> Path:
        """The path a figure is written to."""
        return self.out_dir / self.figures / name

    def link(self, name: str, caption: str) -> str:
        """The markdown image of a figure, relative to the document."""
        return f"![{caption}]({self.figures}/{name})"


def load_study(root: str | Path) -> StudyRuns:
    """Read a study folder (see the module docstring); missing parts stay empty."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(
            f"study folder {root} does not exist; run experiments/scripts/study.sh (make study) "
            "first, or pass the folder it wrote (default multirun/study)"
        )
    runs = StudyRuns(root)
    for name in SWEEPS:
        try:
            runs.sweeps[name] = collect_jobs(root / name)
        except FileNotFoundError:  # not run yet, or started without any job output
            runs.sweeps[name] = []
    for kind in STUDIES:
        folder = root / kind
        found = sorted(folder.glob(f"*/{RESULTS_FILE}")) if folder.is_dir() else []
        runs.studies[kind] = {path.parent.name: read_results(path) for path in found}
    bench = root / "bench.json"
    runs.bench = json.loads(bench.read_text()) if bench.exists() else None
    return runs


def select(rows: Iterable[Row], **wanted: str) -> Row | None:
    """The row whose overrides include every ``key=value`` of ``wanted`` (first match)."""
    for row in rows:
        if all(row.overrides.get(k) == v for k, v in wanted.items()):
            return row
    return None


def mean_std(row: Row | None, metric: str) -> tuple[float, float, int] | None:
    """(mean, sample std, n) of a metric over a row's successful seeds, or None."""
    if row is None:
        return None
    values = row.values(metric)
    if not values:
        return None
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return statistics.fmean(values), std, len(values)


def fmt(stats: tuple[float, float, int] | None, digits: int = 3) -> str:
    """``mean ± std`` (``(n=k)`` appended when fewer than 3 seeds succeeded), or a dash."""
    if stats is None:
        return "–"
    mean, std, n = stats
    return f"{mean:.{digits}f} ± {std:.{digits}f}" + ("" if n >= 3 else f" (n={n})")


def failure_fraction(row: Row | None, kind: str = "backward_not_converged") -> float | None:
    """Mean over a row's jobs of (failure events of ``kind``) / (training steps)."""
    if row is None:
        return None
    fractions = []
    for job in row.jobs:
        steps = _steps_of(job)
        if job.status == "ok" and steps:
            fractions.append(job.failures.get(kind, 0) / steps)
    return statistics.fmean(fractions) if fractions else None


def job_seconds(jobs: Sequence[Job]) -> float:
    """Total training time of ``jobs`` (their ``train_time_s``), in seconds."""
    return sum(job.metrics.get("train_time_s", 0.0) for job in jobs)


def study_seconds(results: Iterable[dict[str, Any]]) -> float:
    """Total recorded run time of no-training studies (``elapsed_s``; 0 where absent)."""
    return sum(float(r.get("elapsed_s") or 0.0) for r in results)


def table(header: Sequence[str], body: Iterable[Sequence[Any]]) -> str:
    """A markdown table; cells as ``format_value`` writes them (floats to 4 significant digits),
    None as a dash."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for cells in body:
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines)


def _cell(value: Any) -> str:
    return "–" if value is None else format_value(value)


def _steps_of(job: Job) -> int:
    cfg = job.config
    try:
        per_epoch = math.ceil(int(cfg["data"]["train_size"]) / int(cfg["batch_size"]))
        return per_epoch * int(cfg["epochs"])
    except (KeyError, TypeError, ValueError):
        return 0


def k_steps(k: int) -> dict[str, str]:
    """The override selecting K in the adjoints sweep."""
    return {"context.steps": str(k)}


def pct(value: float | None) -> str:
    """A fraction as a percentage with one decimal, or a dash."""
    return "–" if value is None else f"{100 * value:.1f} %"
