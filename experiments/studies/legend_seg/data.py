"""The run outputs of the study behind ``docs/results.md``, read from one study folder.

Layout (what ``experiments/scripts/study.sh`` writes under ``multirun/study``)::

    adjoints/<n>/       experiments.train, +experiment=adjoint_ablation (question 1)
    context/<n>/        experiments.train, +experiment=attention_vs_md (question 3)
    remedy/<n>/         experiments.train, +experiment=study_remedy (question 2)
    legend_probe/<n>/   experiments.train, +experiment=legend_probe (the dD/dX probe)
    paper_v4/           experiments.studies.paper_v4.run (study v4: its page section is
                        written from its committed CSV, docs/results/paper_v4.csv)
    grad/<init|trained>_<context>/         experiments.grad_study (question 2)
    convergence/<init|trained>_<context>/  experiments.convergence (question 4)
    bench.json          experiments.bench --json (question 3's compute table)

Every part is optional: the document says which are missing instead of failing. Besides the
loader, this module holds what every section of the document computes with: row selection, mean
± std over seeds, failure shares, and the configured settings read from a job's saved config.
"""

from __future__ import annotations

import json
import logging
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from experiments.engine.results import RESULTS_FILE, ResultsError, read_results
from experiments.reports.sweep_jobs import Job, Row, collect_jobs, group_jobs
from experiments.reports.sweep_time import parallel_jobs, planned_jobs

logger = logging.getLogger(__name__)

CONTEXTS = ("nmf", "vq", "cd")
ADJOINTS = ("unroll", "one_step", "implicit", "phantom")
KS = (1, 3, 6, 12)
METRICS = ("val/blob_acc", "val/miou")
REFERENCE_K = 6  # the paper's K, where the document compares modes
STRESS_TASK = "legend_seg"  # the stress test's task (the study_scale presets), by name
PAPER_TASK = "digit_seg"  # the paper regime's task (study v4, the paper_v4 preset), by name
LEGEND_SWEEPS = ("adjoints", "context", "remedy", "legend_probe")
SWEEPS = (*LEGEND_SWEEPS, "ridge")  # study.sh's Hydra sweeps (the paper regime: study v4's CSV)
STUDIES = ("grad", "convergence")
EXPECTED_STUDIES = {  # what experiments/scripts/study.sh runs
    "grad": (*(f"init_{c}" for c in ("nmf", "vq", "cd", "nmf_normalized")),
             *(f"trained_{c}" for c in ("nmf", "vq", "cd"))),
    "convergence": tuple(f"{p}_{c}" for p in ("init", "trained") for c in ("nmf", "vq", "cd")),
}  # fmt: skip


@dataclass
class StudyRuns:
    """Everything the study produced: sweep jobs, no-training study results, benchmark tables.

    Attributes:
        root: the study folder.
        sweeps: sweep name -> its jobs (empty when the sweep folder is missing).
        studies: "grad" / "convergence" -> {"<init|trained>_<context>": results.json content}.
        bench: the benchmark's JSON tables, or None.
        damaged: part name (``grad/init_nmf``, ``bench.json``) -> the path of its unreadable
            file; such a part is reported as missing, naming the file.
    """

    root: Path
    sweeps: dict[str, list[Job]] = field(default_factory=dict)
    studies: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    bench: dict[str, Any] | None = None
    damaged: dict[str, Path] = field(default_factory=dict)

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
        for name in SWEEPS:  # the sweeps' unfinished jobs
            jobs = self.sweeps.get(name) or []
            ok = sum(job.status == "ok" for job in jobs)
            expected = max(planned_jobs(self.root / name) or len(jobs), len(jobs))
            if jobs and ok < expected:
                out.append(f"{expected - ok}/{expected} jobs of `{name}`")
        for kind, names in EXPECTED_STUDIES.items():
            out += [self._missing(f"{kind}/{name}") for name in names
                    if name not in self.studies.get(kind, {})]  # fmt: skip
        return out + ([] if self.bench is not None else [self._missing("bench.json")])

    def _missing(self, part: str) -> str:
        damaged = self.damaged.get(part)
        return f"`{part}`" + ("" if damaged is None else f" (damaged: {damaged})")

    def parallel_jobs(self, sweep: str) -> int | None:
        """``hydra.launcher.n_jobs`` of a sweep (from its multirun.yaml), or None."""
        return parallel_jobs(self.root / sweep)


def load_study(root: str | Path) -> StudyRuns:
    """Read a study folder (see the module docstring); missing parts stay empty. An unreadable
    file (a garbled ``results.json``, ``bench.json``) is named in a warning and in
    ``runs.damaged``, and its part counts as missing: the rest of the study is still read (a
    sweep's damaged job is a job of status "unreadable", see ``experiments.reports.sweep_jobs``)."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(
            f"study folder {root} does not exist; run experiments/scripts/study.sh (make "
            "study-stress) first, or pass the folder it wrote (default multirun/study)"
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
        runs.studies[kind] = {}
        for path in found:
            try:
                runs.studies[kind][path.parent.name] = read_results(path)
            except ResultsError as err:
                runs.damaged[f"{kind}/{path.parent.name}"] = path
                logger.warning("%s: reported as missing", err)
    bench = root / "bench.json"
    if bench.exists():
        try:
            runs.bench = json.loads(bench.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            runs.damaged["bench.json"] = bench
            logger.warning("%s is not valid JSON (%s): reported as missing", bench, err)
    return runs


def select(rows: Iterable[Row], **wanted: str) -> Row | None:
    """The row whose overrides include every ``key=value`` of ``wanted`` (first match)."""
    return next((r for r in rows if all(r.overrides.get(k) == v for k, v in wanted.items())), None)


def mean_std(row: Row | None, metric: str) -> tuple[float, float, int] | None:
    """(mean, sample std, n) of a metric over a row's successful seeds, or None."""
    if row is None or (stats := row.mean_std(metric)) is None:
        return None
    return (*stats, len(row.values(metric)))


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
    fractions = [job.failures.get(kind, 0) / steps for job in row.jobs
                 if job.status == "ok" and (steps := _steps_of(job))]  # fmt: skip
    return statistics.fmean(fractions) if fractions else None


def job_seconds(jobs: Sequence[Job]) -> float:
    """Total training time of ``jobs`` (their ``train_time_s``), in seconds."""
    return sum(job.metrics.get("train_time_s", 0.0) for job in jobs)


def study_seconds(results: Iterable[dict[str, Any]]) -> float:
    """Total recorded run time of no-training studies (``elapsed_s``; 0 where absent)."""
    return sum(float(r.get("elapsed_s") or 0.0) for r in results)


def _steps_of(job: Job) -> int:
    try:
        return train_steps(job.config) or 0
    except TypeError:  # a config with non-numeric sizes: no step count
        return 0


def k_steps(k: int) -> dict[str, str]:
    """The override selecting K in the adjoints sweep."""
    return {"context.steps": str(k)}


def pct(value: float | None) -> str:
    """A fraction as a percentage with one decimal, or a dash."""
    return "–" if value is None else f"{100 * value:.1f} %"


def config_value(config: Mapping[str, Any] | None, key: str) -> Any:
    """The value at the dotted ``key`` of a saved job config (``"adjoint.k"``), or None where
    the config does not record it."""
    value: Any = config
    for part in key.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def first_config(jobs: Iterable[Job]) -> dict[str, Any]:
    """The saved config of the first job that has one ({} when none does): the settings a
    sweep's jobs share."""
    return next((job.config for job in jobs if job.config), {})


def config_with(rows: Iterable[Row], key: str, **wanted: str) -> dict[str, Any]:
    """The first saved config that records ``key`` among the jobs of the rows whose overrides
    include ``wanted`` ({} when none does): where an arm's settings are read."""
    matching = (r for r in rows if all(r.overrides.get(k) == v for k, v in wanted.items()))
    jobs = (job for row in matching for job in row.jobs)
    return next((job.config for job in jobs if config_value(job.config, key) is not None), {})


def target_name(config: Mapping[str, Any] | None, key: str) -> str | None:
    """The last component of a ``_target_`` (``torch.optim.SGD`` -> ``SGD``) at ``key``."""
    target = config_value(config, f"{key}._target_")
    return None if target is None else str(target).rsplit(".", 1)[-1]


def train_steps(config: Mapping[str, Any]) -> int | None:
    """Optimiser steps of a training job: ceil(train_size / batch_size) * epochs (None without
    them)."""
    size, batch = config_value(config, "data.train_size"), config.get("batch_size")
    epochs = config.get("epochs")
    if not size or not batch or epochs is None:
        return None
    return math.ceil(size / batch) * epochs


@dataclass(frozen=True)
class Figures:
    """Where the document's PNGs go: ``out_dir / folder``; ``link`` is a figure's path relative
    to the document."""

    out_dir: Path
    folder: str

    def path(self, name: str) -> Path:
        """The path a figure is written to."""
        return self.out_dir / self.folder / name

    def link(self, name: str) -> str:
        """The figure's path as the document links it."""
        return f"{self.folder}/{name}"


@dataclass(frozen=True)
class TrainedFrom:
    """The training job behind the checkpoint of no-training studies: its sweep, backward mode
    (``adjoint`` override, or the gradient part of ``+arm``), K and seed; None where the
    studies do not record a checkpoint of this study's sweeps or disagree."""

    sweep: str | None = None
    mode: str | None = None
    k: Any = None
    seed: str | None = None

    @property
    def mode_name(self) -> str | None:
        """The backward mode as the document names it (``unroll`` is BPTT)."""
        return MODE_NAMES.get(self.mode or "", self.mode)


MODE_NAMES = {"unroll": "BPTT"}


def trained_from(runs: StudyRuns, results: Iterable[Mapping[str, Any] | None]) -> TrainedFrom:
    """Where the ``checkpoint`` of the studies ``results`` (results.json contents) comes from,
    found among the study's sweep jobs by directory; ``TrainedFrom()`` unless all agree."""
    jobs = {job.directory.resolve(): (name, job) for name, js in runs.sweeps.items() for job in js}
    found = set()
    for res in results:
        checkpoint = config_value(res, "config.checkpoint")
        match = jobs.get(Path(checkpoint).parent.resolve()) if checkpoint else None
        if match is None:
            found.add(TrainedFrom())
            continue
        name, job = match
        mode = job.overrides.get("adjoint") or _arm_gradient(job.overrides.get("arm", ""))
        k = config_value(job.config, "context.steps") or job.overrides.get("context.steps")
        found.add(TrainedFrom(name, mode, k, job.overrides.get("seed", "0")))
    return found.pop() if len(found) == 1 else TrainedFrom()


def _arm_gradient(arm: str) -> str | None:
    """``nmf_unroll`` -> ``unroll`` (the gradient part of a ham arm), None for other arms."""
    ham, _, gradient = arm.partition("_")
    return gradient if ham in CONTEXTS and gradient else None
