"""``docs/deq_training.md`` from the job files of ``experiments.studies.deq_training.run``.

``build_page(study_dir, figure_dir)`` reads every ``jobs/<arm>_seed<seed>.json``, computes each
arm's numbers (a ``DEQPage`` of ``ArmRow``s) and the "what was found" sentences from them, and
draws the curves; ``render`` fills ``page.md.j2`` with the page (Jinja2, strict:
a missing field is an error). Nothing on the page is typed in: every number and verdict comes
from the job files.

    python -m experiments.report --deq [STUDY_DIR] [--out docs/deq_training.md]
"""

from __future__ import annotations

import csv
import json
import logging
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
from matplotlib.figure import Figure
from scipy import stats

from experiments.studies.deq_training.run import ARMS, DEFAULT_OUT, median_step_time

logger = logging.getLogger(__name__)

TEMPLATES = Path(__file__).parent
COMMAND = (
    "make deq-study   # = the two commands below\n"
    f"python -m experiments.studies.deq_training.run {DEFAULT_OUT} --workers 2\n"
    f"python -m experiments.report --deq {DEFAULT_OUT}"
)
WARNING_KINDS = ("NotFixedPointWarning", "ConvergenceWarning", "ConditioningWarning")
Job = dict[str, Any]


def mean(values: Sequence[float]) -> float:
    """Mean of the finite values; NaN when there are none."""
    finite = [v for v in values if math.isfinite(v)]
    return statistics.fmean(finite) if finite else math.nan


def std(values: Sequence[float]) -> float:
    """Sample standard deviation of the finite values; NaN with fewer than two."""
    finite = [v for v in values if math.isfinite(v)]
    return statistics.stdev(finite) if len(finite) > 1 else math.nan


@dataclass(frozen=True)
class ArmRow:
    """One arm's numbers, each a mean over its finished seeds unless named otherwise.

    Attributes:
        arm, title: the arm's name and description. seeds: finished jobs; failed: those that
            stopped on a non-finite value.
        accuracy, accuracy_std: final test accuracy (mean, std over seeds).
        rho_start, rho_final, rho_max: ρ(J) at the probe's fixed point before training, after
            the last step, and its largest value over training.
        seeds_above_one: seeds whose ρ(J) exceeded 1 at some probe; first_above_one: the
            earliest probe step where it did (over seeds), None if never.
        kappa_final, kappa_max: κ(I - J) at the probe, after the last step / largest.
        forward_steps: forward solver steps per training step (the budget: not converged).
        forward_missed, backward_not_fixed_point, backward_missed: share of training steps whose
            forward solve missed its tolerance, whose implicit gradient was taken at a point
            beyond its fixed-point tolerance, whose backward solve missed its tolerance.
        warnings: warnings issued per job, by class.
        step_ms: median wall time of a training step (ms).
    """

    arm: str
    title: str
    seeds: int
    failed: int
    accuracy: float
    accuracy_std: float
    rho_start: float
    rho_final: float
    rho_max: float
    seeds_above_one: int
    first_above_one: int | None
    kappa_final: float
    kappa_max: float
    forward_steps: float
    forward_missed: float
    backward_not_fixed_point: float
    backward_missed: float
    warnings: dict[str, float]
    step_ms: float
    by_seed: tuple[tuple[int, float], ...] = ()  # (seed, final test accuracy) per finished job


@dataclass(frozen=True)
class DEQPage:
    """Everything the template shows."""

    command: str
    config: dict[str, Any]
    jobs_found: int
    jobs_planned: int
    missing: list[str]
    rows: list[ArmRow]
    findings: list[str]
    figures: list[tuple[str, str]]
    total_job_s: float


def load_jobs(study_dir: str | Path) -> list[Job]:
    """Every readable finished job file of the study, in arm then seed order. A file that is
    not a JSON job object is named in a warning and left out (the page then lists its job as
    missing), so one damaged file does not stop the report."""
    jobs = []
    for path in sorted(Path(study_dir, "jobs").glob("*.json")):
        try:
            job = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            logger.warning("%s is not readable (%s); its job is reported as missing", path, err)
            continue
        if not isinstance(job, dict) or "arm" not in job or "seed" not in job:
            logger.warning("%s is not a job file (no arm / seed); its job is reported as "
                           "missing", path)  # fmt: skip
            continue
        jobs.append(job)
    order = list(ARMS)
    return sorted(jobs, key=lambda j: (order.index(j["arm"]), j["seed"]))


def _share(job: Job, key: str) -> float:
    steps = job["steps"]
    return sum(not s[key] for s in steps) / len(steps) if steps else math.nan


def _rho(job: Job) -> list[float]:
    return [p["spectral_radius"] for p in job["probes"]]


def arm_row(arm: str, jobs: Sequence[Job]) -> ArmRow:
    """The numbers of one arm from its jobs (see ``ArmRow``)."""
    above = [next((p["step"] for p in j["probes"] if p["spectral_radius"] > 1), None)
             for j in jobs]  # fmt: skip
    first = [s for s in above if s is not None]
    warned: dict[str, float] = {}
    for kind in WARNING_KINDS:
        warned[kind] = mean([sum(s["warnings"].get(kind, 0) for s in j["steps"]) for j in jobs])
    accuracies = [j["final_test_accuracy"] for j in jobs if j["final_test_accuracy"] is not None]
    return ArmRow(
        arm=arm,
        title=ARMS[arm].title,
        seeds=len(jobs),
        failed=sum(j["failure"] is not None for j in jobs),
        accuracy=mean(accuracies),
        accuracy_std=std(accuracies),
        rho_start=mean([_rho(j)[0] for j in jobs]),
        rho_final=mean([_rho(j)[-1] for j in jobs]),
        rho_max=mean([max(_rho(j)) for j in jobs]),
        seeds_above_one=len(first),
        first_above_one=min(first) if first else None,
        kappa_final=mean([j["probes"][-1]["kappa"] for j in jobs]),
        kappa_max=mean([max(p["kappa"] for p in j["probes"]) for j in jobs]),
        forward_steps=mean([mean([s["forward_steps"] for s in j["steps"]]) for j in jobs]),
        forward_missed=mean([_share(j, "forward_converged") for j in jobs]),
        backward_not_fixed_point=mean([_share(j, "backward_at_fixed_point") for j in jobs]),
        backward_missed=mean([_share(j, "backward_converged") for j in jobs]),
        warnings=warned,
        step_ms=1e3 * mean([median_step_time(j) for j in jobs]),
        by_seed=tuple(
            (int(j["seed"]), float(j["final_test_accuracy"]))
            for j in jobs
            if j["final_test_accuracy"] is not None
        ),
    )


def _pct(value: float) -> str:
    return "n/a" if not math.isfinite(value) else f"{100 * value:.0f}%"


@dataclass(frozen=True)
class Paired:
    """A paired (by seed) comparison of two arms' final test accuracy: the mean difference a − b,
    the seeds both finished (n) and the two-sided paired t-test's p-value (None below n = 2)."""

    difference: float
    n: int
    p: float | None

    def text(self) -> str:
        """ "paired by seed: −0.009, n = 3, p = 0.10, unresolved at 0.05"."""
        if self.p is None or not math.isfinite(self.p):
            return f"paired by seed: {self.difference:+.3f}, n = {self.n}, no test (unresolved)"
        state = "resolved" if self.p < 0.05 else "unresolved"
        return (f"paired by seed: {self.difference:+.3f}, n = {self.n}, p = {self.p:.2g}, "
                f"{state} at 0.05")  # fmt: skip


def paired(a: ArmRow, b: ArmRow) -> Paired:
    """Arm ``a`` − arm ``b`` in final test accuracy over the seeds both finished."""
    other = dict(b.by_seed)
    diffs = [acc - other[seed] for seed, acc in a.by_seed if seed in other]
    difference = statistics.fmean(diffs) if diffs else math.nan
    if len(diffs) < 2:
        return Paired(difference, len(diffs), None)
    if statistics.stdev(diffs) == 0:
        return Paired(difference, len(diffs), 1.0 if difference == 0 else 0.0)
    return Paired(difference, len(diffs), float(stats.ttest_1samp(diffs, 0.0).pvalue))


def findings(rows: Sequence[ArmRow]) -> list[str]:
    """The "what was found" sentences, each computed from the rows."""
    by_arm = {r.arm: r for r in rows}
    out: list[str] = []
    base = by_arm.get("none")
    if base is not None:
        if base.seeds_above_one:
            out.append(
                f"Without stabilisation the map lost contractivity: ρ(J) at the probe's fixed "
                f"point rose from {base.rho_start:.2f} before training to {base.rho_max:.2f} "
                f"(per-seed maximum, mean over seeds), above 1 in {base.seeds_above_one} of "
                f"{base.seeds} seeds (first at step {base.first_above_one}); "
                f"{_pct(base.backward_not_fixed_point)} of its training steps took the implicit "
                "gradient at a point that was not a fixed point."
            )
        else:
            out.append(
                f"Without stabilisation ρ(J) stayed below 1 in every seed (from "
                f"{base.rho_start:.2f} to at most {base.rho_max:.2f}): this run did not reach "
                "the unstable regime the study is meant to show."
            )
    for row in rows:
        if row.arm == "none" or base is None:
            continue
        above = (f"above 1 in {row.seeds_above_one} of {row.seeds} seeds"
                 if row.seeds_above_one else "below 1 in every seed")  # fmt: skip
        accuracy = paired(row, base).text()
        out.append(
            f"{row.title[0].upper()}{row.title[1:]}: ρ(J) at most {row.rho_max:.2f} ({above}; "
            f"no stabilisation {base.rho_max:.2f}), implicit gradients at a non-fixed point in "
            f"{_pct(row.backward_not_fixed_point)} of steps (vs "
            f"{_pct(base.backward_not_fixed_point)}), {row.forward_steps:.1f} forward steps per "
            f"training step (vs {base.forward_steps:.1f}), test accuracy {row.accuracy:.3f} vs "
            f"{base.accuracy:.3f} ({accuracy}), {row.step_ms / base.step_ms:.2f}x its time per "
            "step."
        )
    if rows:
        fewest = min(rows, key=lambda r: (r.backward_not_fixed_point, r.rho_max))
        best = max(rows, key=lambda r: r.accuracy if math.isfinite(r.accuracy) else -1.0)
        tests = [paired(best, r) for r in rows if r is not best]
        resolved = [t for t in tests if t.p is not None and t.p < 0.05]
        ps = [t.p for t in tests if t.p is not None]
        ranking = (
            f"resolved (paired by seed, p < 0.05) against {len(resolved)} of {len(tests)} arms"
            if resolved else "no difference from another arm is resolved (paired by seed, "
            f"n = {min((t.n for t in tests), default=0)}, smallest p = "
            f"{min(ps):.2g})" if ps else "no paired test possible"
        )  # fmt: skip
        out.append(
            f"Fewest non-fixed-point gradients: {fewest.title} "
            f"({_pct(fewest.backward_not_fixed_point)} of steps, ρ(J) at most "
            f"{fewest.rho_max:.2f}). Highest mean test accuracy: {best.title} "
            f"({best.accuracy:.3f}); {ranking}."
        )
    return out


def _curve(jobs: Sequence[Job], key: str) -> tuple[list[int], list[float]]:
    """Probe steps and the mean over jobs of ``key`` at each (jobs probe the same steps)."""
    steps = [p["step"] for p in jobs[0]["probes"]]
    values = [mean([j["probes"][i][key] for j in jobs if i < len(j["probes"])])
              for i in range(len(steps))]  # fmt: skip
    return steps, values


def _plot(groups: dict[str, list[Job]], ylabel: str, path: Path,
          series: Callable[[list[Job]], tuple[list[int], list[float]]],
          logy: bool = False, line: float | None = None) -> None:  # fmt: skip
    fig = Figure(figsize=(6.5, 3.8))
    ax = fig.subplots()
    for arm, jobs in groups.items():
        x, y = series(jobs)
        ax.plot(x, y, marker="o" if len(x) <= 40 else None, markersize=3, label=ARMS[arm].title)
    if line is not None:
        ax.axhline(line, color="black", linewidth=0.8, linestyle="--")
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel("training step")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _forward_steps(jobs: list[Job], window: int = 10) -> tuple[list[int], list[float]]:
    """Forward steps per training step, averaged over jobs and a trailing window."""
    n = min(len(j["steps"]) for j in jobs)
    per_step = [mean([j["steps"][i]["forward_steps"] for j in jobs]) for i in range(n)]
    smooth = [mean(per_step[max(0, i - window + 1) : i + 1]) for i in range(n)]
    return [j + 1 for j in range(n)], smooth


def draw_figures(groups: dict[str, list[Job]], figure_dir: Path) -> list[tuple[str, str]]:
    """The curves per arm (means over seeds) as PNGs; (caption, file name) pairs."""
    figure_dir.mkdir(parents=True, exist_ok=True)
    specs: list[tuple[str, str, Callable[[list[Job]], Any], bool, float | None]] = [
        ("test accuracy", "accuracy.png", lambda j: _curve(j, "test_accuracy"), False, None),
        ("ρ(J) at the probe's fixed point", "spectral_radius.png",
         lambda j: _curve(j, "spectral_radius"), False, 1.0),
        ("κ(I - J) at the probe's fixed point", "kappa.png", lambda j: _curve(j, "kappa"),
         True, None),
        ("forward steps per training step (10-step mean)", "forward_steps.png",
         _forward_steps, False, None),
    ]  # fmt: skip
    shown = {arm: jobs for arm, jobs in groups.items() if all(j["steps"] for j in jobs)}
    out = []
    for caption, name, series, logy, line in specs:
        _plot(shown, caption, figure_dir / name, series, logy, line)
        out.append((caption, f"{figure_dir.name}/{name}"))
    return out


def build_page(study_dir: str | Path, figure_dir: str | Path) -> DEQPage:
    """The page's numbers, sentences and figures from the study's job files.

    Raises:
        FileNotFoundError: no finished job under ``study_dir/jobs``.
    """
    study_dir = Path(study_dir)
    jobs = load_jobs(study_dir)
    if not jobs:
        raise FileNotFoundError(
            f"no finished job under {study_dir / 'jobs'}; run python -m "
            f"experiments.studies.deq_training.run {study_dir} first"
        )
    config = json.loads((study_dir / "config.json").read_text())
    planned = [f"{a}_seed{s}" for a in config["arms"] for s in config["seeds"]]
    found = {f"{j['arm']}_seed{j['seed']}" for j in jobs}
    groups: dict[str, list[Job]] = {}
    for job in jobs:
        groups.setdefault(job["arm"], []).append(job)
    rows = [arm_row(arm, group) for arm, group in groups.items()]
    return DEQPage(
        command=COMMAND,
        config=config,
        jobs_found=len(jobs),
        jobs_planned=len(planned),
        missing=[name for name in planned if name not in found],
        rows=rows,
        findings=findings(rows),
        figures=draw_figures(groups, Path(figure_dir)),
        total_job_s=sum(j["wall_s"] for j in jobs),
    )


def _num(value: float | None, digits: int = 3) -> str:
    """A number for the tables: fixed digits; "n/a" for None / NaN."""
    if value is None or not math.isfinite(value):
        return "n/a"
    return f"{value:.{digits}f}"


def render(page: DEQPage) -> str:
    """The markdown page (``page.md.j2`` filled with ``page``)."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,  # markdown, not HTML
    )
    env.filters["num"] = _num
    env.filters["pct"] = _pct
    return env.get_template("page.md.j2").render(page=page, kinds=WARNING_KINDS)


JOB_COLUMNS = (
    "arm", "seed", "final_test_accuracy", "rho_start", "rho_max", "rho_final", "kappa_max",
    "kappa_final", "forward_steps", "forward_missed", "backward_not_fixed_point",
    "backward_missed", "step_ms", "wall_s", "failure",
)  # fmt: skip


def job_rows(jobs: Sequence[Job]) -> list[dict[str, Any]]:
    """One row per job (``JOB_COLUMNS``): the per-seed numbers behind the page's means."""
    out = []
    for job in jobs:
        row = arm_row(job["arm"], [job])
        out.append({
            "arm": job["arm"], "seed": job["seed"],
            "final_test_accuracy": job["final_test_accuracy"], "rho_start": row.rho_start,
            "rho_max": row.rho_max, "rho_final": row.rho_final, "kappa_max": row.kappa_max,
            "kappa_final": row.kappa_final, "forward_steps": row.forward_steps,
            "forward_missed": row.forward_missed,
            "backward_not_fixed_point": row.backward_not_fixed_point,
            "backward_missed": row.backward_missed, "step_ms": row.step_ms,
            "wall_s": job["wall_s"], "failure": job["failure"] or "",
        })  # fmt: skip
    return out


def write_job_rows(jobs: Sequence[Job], path: Path) -> Path:
    """The per-job rows as a CSV at ``path`` (committed beside the page's figures)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(JOB_COLUMNS), lineterminator="\n")
        writer.writeheader()
        writer.writerows(job_rows(jobs))
    return path


def write_deq_report(study_dir: str | Path, out: str | Path = "docs/deq_training.md") -> Path:
    """Write the page to ``out``, its figures and its per-job rows (``jobs.csv``) to
    ``<out's folder>/deq_training/``."""
    out = Path(out)
    page = build_page(study_dir, out.parent / out.stem)
    write_job_rows(load_jobs(study_dir), out.parent / out.stem / "jobs.csv")
    out.write_text(render(page))
    logger.info("DEQ training page: %s (%d of %d jobs)", out, page.jobs_found, page.jobs_planned)
    return out
