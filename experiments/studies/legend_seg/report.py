"""``docs/results.md``: the study's answers to the paper's gradient claims, generated from runs.

Every number, setting and verdict is computed from the run outputs (the configs and results
each job saved) into frozen dataclasses, one per section (``study_stress``,
``study_gradients``, ``study_baselines``, ``study_convergence``, ``study_ridge``); the prose is
in the templates ``templates/study/*.md.j2``. Section 1, study v3 of the paper regime, is a
static history (``templates/study/paper_v3.md.j2``: its code was removed, its rows stay in
``docs/results/paper_v3.csv``); study v4's section is written above it by
``experiments.studies.paper_v4.report``. Where a part of the study is missing, the document says
so. ``write_study_report`` also writes ``findings.md`` beside the figures: the summary, the
closing note and study v3's verdicts, which ``docs/index.md`` includes.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from experiments.reports.render import render_beside
from experiments.reports.sweep_time import sweep_span_s
from experiments.studies.legend_seg.baselines import Baselines, baselines
from experiments.studies.legend_seg.convergence import Convergence, convergence
from experiments.studies.legend_seg.data import (
    LEGEND_SWEEPS,
    PAPER_TASK,
    Figures,
    StudyRuns,
    config_value,
    first_config,
    job_seconds,
    load_study,
    study_seconds,
    train_steps,
)
from experiments.studies.legend_seg.gradients import Gradients, gradients
from experiments.studies.legend_seg.job_rows import ROWS_FILE, write_rows
from experiments.studies.legend_seg.ridge import Ridge, ridge
from experiments.studies.legend_seg.stress import StressTest, stress_test

FIGURES = "results"  # the figures folder beside results.md: docs/results/
FINDINGS = "findings.md"  # written into the figures folder: docs/results/findings.md


@dataclass(frozen=True)
class StressSetup:
    """The stress test's settings, from the first legend_seg job config: dataset, its size,
    the model, optimiser and parallelism (``parallel_jobs``: the adjoints sweep's launcher)."""

    dataset: str | None
    data: dict[str, Any]
    arch: Any
    width: Any
    batch_size: Any
    epochs: Any
    steps: int | None
    optimizer: Any
    lr: Any
    threads: Any
    parallel_jobs: Any


@dataclass(frozen=True)
class SweepTime:
    """One sweep's jobs (``ok`` of ``jobs``), its summed training time and its wall-clock
    span in minutes (None when unknown)."""

    name: str
    ok: int
    jobs: int
    train_minutes: float
    span_minutes: float | None


@dataclass(frozen=True)
class Scale:
    """The scale-and-compute section: settings, per-sweep times, the no-training studies'
    count and minutes, the total, the last ``make study-stress`` invocation's minutes (None without
    both stamps) and the missing parts."""

    paper_task: str
    stress: StressSetup | None
    sweeps: tuple[SweepTime, ...]
    studies: int
    study_minutes: float
    total_minutes: float
    invocation_minutes: float | None
    missing: tuple[str, ...]


@dataclass(frozen=True)
class StudyDocument:
    """Everything ``docs/results.md`` says, section by section."""

    root: Path
    date: str
    commands: str
    scale: Scale
    stress: StressTest
    gradients: Gradients
    baselines: Baselines
    convergence: Convergence
    ridge: Ridge


def write_study_report(root: str | Path, out_dir: str | Path, commands: str) -> Path:
    """Write ``out_dir/results.md``, its PNGs, ``findings.md`` and the per-job rows
    (``experiments.studies.legend_seg.job_rows``; both in ``out_dir/results``)
    from the study folder ``root``; ``commands`` is the shell script that produced the runs,
    quoted at the top."""
    runs = load_study(root)
    out_dir = Path(out_dir)
    (out_dir / FIGURES).mkdir(parents=True, exist_ok=True)
    doc = study_document(runs, Figures(out_dir, FIGURES), commands)
    findings = render_beside(__file__, "study/findings.md.j2", doc=doc)
    (out_dir / FIGURES / FINDINGS).write_text(findings)
    write_rows(runs, out_dir / FIGURES / ROWS_FILE)
    path = out_dir / "results.md"
    path.write_text(render_beside(__file__, "study/results.md.j2", doc=doc))
    return path


def study_document(runs: StudyRuns, figures: Figures, commands: str) -> StudyDocument:
    """Compute every section of the document (writing the figures into ``figures``)."""
    return StudyDocument(
        root=runs.root,
        date=datetime.date.today().isoformat(),
        commands=commands.strip(),
        scale=scale(runs),
        stress=stress_test(runs, figures),
        gradients=gradients(runs, figures),
        baselines=baselines(runs),
        convergence=convergence(runs, figures),
        ridge=ridge(runs.root),
    )


def scale(runs: StudyRuns) -> Scale:
    """The scale-and-compute section's data."""
    jobs = [job for name in LEGEND_SWEEPS for job in runs.sweeps.get(name, [])]
    config = first_config(jobs)
    stress = None
    if config:
        stress = StressSetup(
            dataset=str(config_value(config, "data._target_")).rsplit(".", 1)[-1],
            data=config.get("data", {}),
            arch=config_value(config, "model.arch"),
            width=config_value(config, "model.width"),
            batch_size=config.get("batch_size"),
            epochs=config.get("epochs"),
            steps=train_steps(config),
            optimizer=config_value(config, "optim._target_"),
            lr=config_value(config, "optim.lr"),
            threads=config.get("threads"),
            parallel_jobs=runs.parallel_jobs("adjoints"),
        )
    spans = {name: sweep_span_s(js) for name, js in runs.sweeps.items() if js}
    sweeps = tuple(
        SweepTime(name, sum(job.status == "ok" for job in runs.sweeps[name]),
                  len(runs.sweeps[name]), job_seconds(runs.sweeps[name]) / 60,
                  None if span is None else span / 60)
        for name, span in spans.items()
    )  # fmt: skip
    studies = [r for kind in runs.studies.values() for r in kind.values()]
    span_s = sum(span for span in spans.values() if span is not None)
    return Scale(
        paper_task=PAPER_TASK,
        stress=stress,
        sweeps=sweeps,
        studies=len(studies),
        study_minutes=study_seconds(studies) / 60,
        total_minutes=span_s / 60 + study_seconds(studies) / 60,
        invocation_minutes=_invocation_minutes(runs.root),
        missing=tuple(runs.missing()),
    )


def _invocation_minutes(root: Path) -> float | None:
    """Minutes between the ``.started`` and ``.finished`` stamps ``experiments/scripts/study.sh``
    writes (epoch seconds), or None without both or when they are out of order (an unfinished
    run)."""
    try:
        start, end = (float((root / name).read_text()) for name in (".started", ".finished"))
    except (FileNotFoundError, ValueError):
        return None
    return (end - start) / 60 if end >= start else None
