"""``docs/deq_training.md`` from the DEQ study's committed rows (``docs/deq_training/runs.csv``,
written by ``experiments.studies.deq_training.run`` as its jobs end).

``build_page(csv, figure_dir)`` reads the rows, computes each arm's numbers (a ``DEQPage`` of
``ArmRow``s), the accuracy comparisons (each stabilised arm − no stabilisation, paired by seed:
mean difference, 95 % interval, n, the paired t-test's p and Holm's adjustment over the arms
compared) and the "what was found" sentences, and draws the curves from the rows' curves;
``render`` fills ``page.md.j2`` (Jinja2, strict). Nothing on the page is typed in: with no rows
the page says the rows are pending and computes nothing.

    python -m experiments.report --deq docs/deq_training/runs.csv [--out docs/deq_training.md]
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
import re
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
from matplotlib.figure import Figure

from experiments.reports.verdicts import holm, p_value, paired_interval
from experiments.studies.deq_training.rows import (
    DEFAULT_CSV,
    WARNING_KINDS,
    Row,
    config_text,
    curve,
    mean,
    read_rows,
)
from experiments.studies.deq_training.run import ARMS, DEFAULT_OUT, StudyConfig

logger = logging.getLogger(__name__)

TEMPLATES = Path(__file__).parent
COMMAND = (
    "make deq-study   # = the two commands below\n"
    f"OMP_NUM_THREADS=1 python -m experiments.studies.deq_training.run {DEFAULT_OUT} "
    f"--csv {DEFAULT_CSV} --workers 2\n"
    f"python -m experiments.report --deq {DEFAULT_CSV}"
)
LEVEL = 0.05


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


# the ``ArmRow`` fields that are the mean of the rows' column of the same name
MEANS = ("rho_start", "rho_final", "rho_max", "kappa_final", "kappa_max", "forward_steps",
         "forward_missed", "backward_not_fixed_point", "backward_missed", "step_ms")  # fmt: skip


@dataclass(frozen=True)
class DEQPage:
    """Everything the template shows."""

    command: str
    csv: str
    config: dict[str, Any]
    jobs_found: int
    jobs_planned: int
    other_config: int  # rows of another configuration, left out
    missing: list[str]
    rows: list[ArmRow]
    tests: list[Paired]
    findings: list[str]
    figures: list[tuple[str, str]]
    total_job_s: float
    processors: list[str]
    commits: list[str]
    arm_titles: list[tuple[str, str]]


def arm_row(arm: str, rows: Sequence[Row]) -> ArmRow:
    """The numbers of one arm from its rows (see ``ArmRow``): means of the per-job values."""
    first = [r["first_above_one"] for r in rows if r["first_above_one"] is not None]
    done = [r for r in rows if r["final_test_accuracy"] is not None]
    means: dict[str, Any] = {name: mean([r[name] for r in rows]) for name in MEANS}
    return ArmRow(
        arm=arm,
        title=ARMS[arm].title,
        seeds=len(rows),
        failed=sum(bool(r["failure"]) for r in rows),
        accuracy=mean([r["final_test_accuracy"] for r in done]),
        accuracy_std=std([r["final_test_accuracy"] for r in done]),
        seeds_above_one=len(first),
        first_above_one=min(first) if first else None,
        warnings={k: mean([r[f"warnings_{k}"] for r in rows]) for k in WARNING_KINDS},
        by_seed=tuple((int(r["seed"]), float(r["final_test_accuracy"])) for r in done),
        **means,
    )


def _pct(value: float) -> str:
    return "n/a" if not math.isfinite(value) else f"{100 * value:.0f}%"


@dataclass(frozen=True)
class Paired:
    """Arm − no stabilisation in final test accuracy, paired by seed: the mean difference, its
    95 % t interval, the seeds both finished (n), the two-sided paired t-test's p (None below
    n = 2) and Holm's adjustment over every arm compared (None below n = 2)."""

    arm: str
    title: str
    difference: float
    lower: float
    upper: float
    n: int
    p: float | None
    holm_p: float | None = field(default=None)

    @property
    def resolved(self) -> bool:
        """Whether the difference is resolved at ``LEVEL`` after Holm."""
        return self.holm_p is not None and self.holm_p < LEVEL

    def text(self) -> str:
        """ "paired by seed: −0.009 [−0.030, +0.012], n = 3, p = 0.21, Holm p = 0.63:
        unresolved"."""
        if self.p is None or self.holm_p is None:
            return f"paired by seed: n = {self.n}, no test (unresolved)"
        state = "resolved" if self.resolved else "unresolved"
        return (f"paired by seed: {self.difference:+.3f} [{self.lower:+.3f}, {self.upper:+.3f}], "
                f"n = {self.n}, p = {self.p:.2g}, Holm p = {self.holm_p:.2g}: {state}")  # fmt: skip


def paired(a: ArmRow, b: ArmRow) -> Paired:
    """Arm ``a`` − arm ``b`` in final test accuracy over the seeds both finished (no Holm)."""
    other = dict(b.by_seed)
    diffs = [acc - other[seed] for seed, acc in a.by_seed if seed in other]
    if len(diffs) < 2:
        mean_diff = statistics.fmean(diffs) if diffs else math.nan
        return Paired(a.arm, a.title, mean_diff, math.nan, math.nan, len(diffs), None)
    interval = paired_interval(diffs)
    return Paired(a.arm, a.title, interval.mean, interval.lower, interval.upper, len(diffs),
                  p_value(diffs, 0.0))  # fmt: skip


def comparisons(rows: Sequence[ArmRow]) -> list[Paired]:
    """Every stabilised arm − no stabilisation (paired by seed), Holm over those with a test."""
    by_arm = {r.arm: r for r in rows}
    base = by_arm.get("none")
    if base is None:
        return []
    tests = [paired(r, base) for r in rows if r.arm != "none"]
    tested = [t for t in tests if t.p is not None]
    adjusted = dict(zip((t.arm for t in tested), holm([t.p for t in tested if t.p is not None]),
                        strict=True))  # fmt: skip
    return [dataclasses.replace(t, holm_p=adjusted.get(t.arm)) for t in tests]


def findings(rows: Sequence[ArmRow], tests: Sequence[Paired]) -> list[str]:
    """The "what was found" sentences, each computed from the rows."""
    by_arm = {r.arm: r for r in rows}
    by_test = {t.arm: t for t in tests}
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
        out.append(
            f"{row.title[0].upper()}{row.title[1:]}: ρ(J) at most {row.rho_max:.2f} ({above}; "
            f"no stabilisation {base.rho_max:.2f}), implicit gradients at a non-fixed point in "
            f"{_pct(row.backward_not_fixed_point)} of steps (vs "
            f"{_pct(base.backward_not_fixed_point)}), {row.forward_steps:.1f} forward steps per "
            f"training step (vs {base.forward_steps:.1f}), test accuracy − no stabilisation "
            f"{by_test[row.arm].text()}, {row.step_ms / base.step_ms:.2f}x its time per step."
        )
    if tests:
        resolved = [t for t in tests if t.resolved]
        out.append(
            f"Test accuracy: {len(resolved)} of {len(tests)} stabilised arms differ from no "
            f"stabilisation at p < {LEVEL:g} after Holm over {len(tests)} (paired t-tests by "
            f"seed){': ' + ', '.join(f'{t.title} {t.difference:+.3f}' for t in resolved) if resolved else '; every accuracy difference is unresolved at these seeds'}."  # noqa: E501
        )
    if rows:
        fewest = min(rows, key=lambda r: (r.backward_not_fixed_point, r.rho_max))
        out.append(
            f"Lowest mean share of non-fixed-point gradients: {fewest.title} "
            f"({_pct(fewest.backward_not_fixed_point)} of steps, ρ(J) at most "
            f"{fewest.rho_max:.2f})."
        )
    return out


def _curve(rows: Sequence[Row], column: str) -> tuple[list[int], list[float]]:
    """The steps of ``column``'s curve and, at each, the mean over ``rows`` (rows of one
    configuration share their steps; a shorter curve, a job that stopped, drops out)."""
    curves = [curve(r, column) for r in rows]
    steps = [step for step, _ in max(curves, key=len)]
    values = [mean([c[i][1] for c in curves if i < len(c)]) for i in range(len(steps))]
    return steps, values


def _plot(groups: Mapping[str, Sequence[Row]], ylabel: str, path: Path,
          series: Callable[[Sequence[Row]], tuple[list[int], list[float]]],
          logy: bool = False, line: float | None = None) -> None:  # fmt: skip
    fig = Figure(figsize=(6.5, 3.8))
    ax = fig.subplots()
    for arm, rows in groups.items():
        x, y = series(rows)
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


def _forward_steps(rows: Sequence[Row], window: int = 10) -> tuple[list[int], list[float]]:
    """Forward steps per training step, averaged over rows and a trailing window."""
    steps, per_step = _curve(rows, "forward_curve")
    smooth = [mean(per_step[max(0, i - window + 1) : i + 1]) for i in range(len(per_step))]
    return steps, smooth


def draw_figures(groups: Mapping[str, Sequence[Row]], figure_dir: Path) -> list[tuple[str, str]]:
    """The curves per arm (means over seeds) as PNGs; (caption, file name) pairs."""
    figure_dir.mkdir(parents=True, exist_ok=True)
    specs: list[tuple[str, str, Callable[[Sequence[Row]], Any], bool, float | None]] = [
        ("test accuracy", "accuracy.png", lambda r: _curve(r, "accuracy_curve"), False, None),
        ("ρ(J) at the probe's fixed point", "spectral_radius.png",
         lambda r: _curve(r, "rho_curve"), False, 1.0),
        ("κ(I - J) at the probe's fixed point", "kappa.png", lambda r: _curve(r, "kappa_curve"),
         True, None),
        ("forward steps per training step (10-step mean)", "forward_steps.png",
         _forward_steps, False, None),
    ]  # fmt: skip
    shown = {arm: rows for arm, rows in groups.items() if all(r["forward_curve"] for r in rows)}
    out = []
    for caption, name, series, logy, line in specs:
        _plot(shown, caption, figure_dir / name, series, logy, line)
        out.append((caption, f"{figure_dir.name}/{name}"))
    return out


def build_page(
    csv: str | Path, figure_dir: str | Path, config: StudyConfig | None = None
) -> DEQPage:
    """The page's numbers, sentences and figures from the study's rows alone (rows of another
    configuration than ``config``, default ``StudyConfig()``, are left out and counted); with
    no row of it, a page that says the rows are pending (no figure drawn)."""
    config = config or StudyConfig()
    key = config_text(config.job_key())
    every = read_rows(csv)
    rows = [r for r in every if r["config"] == key and r["arm"] in config.arms
            and r["seed"] in config.seeds]  # fmt: skip
    order = list(ARMS)
    rows.sort(key=lambda r: (order.index(r["arm"]), r["seed"]))
    planned = [f"{a}_seed{s}" for a in config.arms for s in config.seeds]
    found = {f"{r['arm']}_seed{r['seed']}" for r in rows}
    groups = {arm: list(group) for arm, group in itertools.groupby(rows, lambda r: r["arm"])}
    arms = [arm_row(arm, group) for arm, group in groups.items()]
    tests = comparisons(arms)
    cpus = sorted({str(r["cpu"] or "unknown") for r in rows})
    return DEQPage(
        command=COMMAND,
        csv=str(csv),
        config={**dataclasses.asdict(config)},
        jobs_found=len(rows),
        jobs_planned=len(planned),
        other_config=len(every) - len(rows),
        missing=[name for name in planned if name not in found],
        rows=arms,
        tests=tests,
        findings=findings(arms, tests),
        figures=draw_figures(groups, Path(figure_dir)) if rows else [],
        total_job_s=sum(r["wall_s"] for r in rows),
        processors=cpus,
        commits=sorted({str(r["commit"] or "unknown") for r in rows}),
        arm_titles=[(a, ARMS[a].title) for a in config.arms],
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
    env.filters["signed"] = lambda v: "n/a" if v is None or not math.isfinite(v) else f"{v:+.3f}"
    env.filters["pct"] = _pct
    text = env.get_template("page.md.j2").render(page=page, kinds=WARNING_KINDS)
    return re.sub(r"\n{3,}", "\n\n", text)  # the optional blocks' blank lines


def write_deq_report(csv: str | Path = DEFAULT_CSV, out: str | Path = "docs/deq_training.md",
                     config: StudyConfig | None = None) -> Path:  # fmt: skip
    """Write the page to ``out`` and its figures to ``<out's folder>/<out's stem>/`` from the
    rows of ``csv`` (the figures only when there are rows)."""
    out = Path(out)
    page = build_page(csv, out.parent / out.stem, config)
    out.write_text(render(page))
    logger.info("DEQ training page: %s (%d of %d jobs)", out, page.jobs_found, page.jobs_planned)
    return out
