"""``docs/generation.md`` from a sweep of ``experiments.generate`` (``make generate``).

Reads the jobs with ``experiments.reports.sweep`` (grouped by arm, seeds pooled), and writes:
the metrics table per arm (mean ± std over seeds) with the real data's reference values, the
time per arm, a sample grid per arm (copied from seed 0's ``samples.png``), the training curves
(FID of ``metrics.curve_samples`` EMA samples, and the hinge losses) and a verdict sentence
computed from the numbers. The numbers and settings (from the jobs' saved configs) go into a
``GenerationPage``; ``templates/generation/page.md.j2`` (under ``experiments/reports``) writes
the page.
"""

from __future__ import annotations

import inspect
import json
import logging
import math
import shutil
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from experiments.data.twin_digits import CANVAS, DIGIT
from experiments.engine.results import read_results
from experiments.generation.metrics import consistency
from experiments.models.digit_classifier import FEATURES
from experiments.models.gan import CONTEXT_SIZE
from experiments.reports.render import Table, render
from experiments.reports.sweep import (
    Job,
    Row,
    collect_jobs,
    failures,
    group_jobs,
    parallel_jobs,
    planned_jobs,
    sweep_span_s,
)

logger = logging.getLogger(__name__)

ARMS = ("none", "self_attention", "nmf_one_step", "nmf_unroll")
ARM_TITLES = {
    "none": "no context",
    "self_attention": "self-attention (SAGAN-style)",
    "nmf_one_step": "Hamburger NMF, one-step (HamGAN)",
    "nmf_unroll": "Hamburger NMF, BPTT",
}
METRICS = (
    ("fid", "FID ↓", 1),
    ("kid", "KID ↓", 2),
    ("precision", "precision ↑", 3),
    ("recall", "recall ↑", 3),
    ("consistency", "consistency ↑", 3),
)
IGNORED = ("seed", "experiment")
MIN_SEEDS = 2  # per arm, for a comparison of two arms
# The paper's headline (Geng et al. 2021): ImageNet 128x128 FID, HamGAN vs SAGAN.
PAPER_FID = {"HamGAN": 14.77, "SAGAN": 18.28}
PAPER_RESOLUTION = 128


def arm_of(row: Row) -> str:
    """The row's ``+arm`` override (``default`` when none was given)."""
    return row.overrides.get("arm", "default")


def ordered_rows(jobs: Sequence[Job]) -> list[Row]:
    """Rows (one per arm, seeds pooled) in the order of ``ARMS``, unknown arms after."""
    rows = group_jobs(jobs, ignore=IGNORED)
    rank = {arm: i for i, arm in enumerate(ARMS)}
    return sorted(rows, key=lambda r: (rank.get(arm_of(r), len(ARMS)), arm_of(r)))


def _fmt(stats: tuple[float, float] | None, digits: int) -> str:
    return "–" if stats is None else f"{stats[0]:.{digits}f} ± {stats[1]:.{digits}f}"


def _results(row: Row) -> list[dict[str, Any]]:
    return [read_results(job.directory) for job in row.jobs if job.status == "ok"]


def _mean_std(values: Sequence[float]) -> tuple[float, float] | None:
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return None
    return statistics.fmean(finite), statistics.stdev(finite) if len(finite) > 1 else 0.0


def metrics_table(rows: Sequence[Row]) -> Table:
    """Arm, seeds (ok / all), then mean ± std of each metric; a last row holds the real data's
    reference values (real training canvases scored against the real set)."""
    header = ["arm", "seeds", *(title for _, title, _ in METRICS)]
    body: list[list[str]] = []
    references: list[dict[str, Any]] = []
    for row in rows:
        ok = sum(job.status == "ok" for job in row.jobs)
        cells = [ARM_TITLES.get(arm_of(row), arm_of(row)), f"{ok}/{len(row.jobs)}"]
        body.append(cells + [_fmt(row.mean_std(key), digits) for key, _, digits in METRICS])
        references += [r["reference"] for r in _results(row)]
    if references:  # the same real sets in every job: one value
        cells = ["real data (reference)", "–"]
        for key, _, digits in METRICS:
            stats = _mean_std([float(r[key]) for r in references])
            if stats is not None and stats[1] == 0:
                cells.append(f"{stats[0]:.{digits}f}")
            else:
                cells.append(_fmt(stats, digits))
        body.append(cells)
    return Table.of(header, body)


def cost_table(rows: Sequence[Row]) -> Table:
    """Parameters (G, D, their context blocks), training time per run and per step,
    evaluation time, failure events and dropped updates, per arm (means over seeds)."""
    header = ["arm", "G params", "D params", "context (G / D)", "train time (s)",
              "s / step", "eval time (s)", "failure events", "dropped updates"]  # fmt: skip
    body = []
    for row in rows:
        results = _results(row)
        if not results:
            continue
        params = results[0]["parameters"]
        train = _mean_std([r["train_time_s"] for r in results])
        per_step = _mean_std([r["train_time_s"] / max(r["steps"], 1) for r in results])
        evals = _mean_std([r["eval_time_s"] for r in results])
        events = sum(int(r["failures"]["total"]) for r in results)
        dropped = sum(sum(r["failures"]["skipped_updates"].values()) for r in results)
        body.append([
            ARM_TITLES.get(arm_of(row), arm_of(row)),
            f"{params['G']:,}",
            f"{params['D']:,}",
            f"{params['G_context']:,} / {params['D_context']:,}",
            _fmt(train, 0),
            _fmt(per_step, 3),
            _fmt(evals, 0),
            str(events),
            str(dropped),
        ])  # fmt: skip
    return Table.of(header, body)


@dataclass(frozen=True)
class Comparison:
    """HamGAN's one-step arm against another arm: the verdict word and both FIDs."""

    arm: str
    word: str
    one_step: tuple[float, float]
    other: tuple[float, float]


@dataclass(frozen=True)
class Verdict:
    """The sentence's numbers: the arm with the lowest mean FID (title, mean ± std) and the
    fewest seeds any arm has (None without a finished run), the one-step arm's comparisons,
    the most consistent arm with the real data's consistency."""

    best: tuple[str, tuple[float, float]] | None
    seeds: int
    comparisons: tuple[Comparison, ...] | None
    consistent: tuple[str, float, float] | None


def verdict_data(rows: Sequence[Row]) -> Verdict:
    """The verdict from the numbers: the arm with the lowest mean FID, and whether HamGAN's
    one-step arm beats each other arm by more than the sum of the two standard deviations
    (otherwise the difference is called unresolved at this number of seeds; with fewer than
    ``MIN_SEEDS`` seeds on either side no comparison is claimed)."""
    stats = {arm_of(r): s for r in rows if (s := r.mean_std("fid")) is not None}
    if not stats:
        return Verdict(None, 0, None, None)
    best = min(stats, key=lambda k: stats[k][0])
    seeds = min(len(r.values("fid")) for r in rows if arm_of(r) in stats)
    counts = {arm_of(r): len(r.values("fid")) for r in rows}
    one = stats.get("nmf_one_step")
    comparisons = None
    if one is not None:
        found = []
        for arm, other in stats.items():
            if arm == "nmf_one_step":
                continue
            gap, margin = other[0] - one[0], one[1] + other[1]
            if min(counts[arm], counts["nmf_one_step"]) < MIN_SEEDS:
                word = f"not comparable yet (fewer than {MIN_SEEDS} seeds)"
            elif abs(gap) <= margin:
                word = "no resolvable difference"
            else:
                word = "one-step better" if gap > 0 else "one-step worse"
            found.append(Comparison(ARM_TITLES.get(arm, arm), word, one, other))
        comparisons = tuple(found)
    agreement = {arm_of(r): s for r in rows if (s := r.mean_std("consistency")) is not None}
    references = [float(r["reference"]["consistency"]) for row in rows for r in _results(row)]
    consistent = None
    if agreement and references:
        top = max(agreement, key=lambda k: agreement[k][0])
        consistent = (ARM_TITLES.get(top, top), agreement[top][0], statistics.fmean(references))
    return Verdict((ARM_TITLES.get(best, best), stats[best]), seeds, comparisons, consistent)


def verdict(rows: Sequence[Row]) -> str:
    """The verdict sentence (``verdict_data``) as the page writes it."""
    return render("generation/verdict.md.j2", v=verdict_data(rows)).strip()


def _curves(job: Job) -> list[dict[str, Any]]:
    path = job.directory / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def plot_curves(rows: Sequence[Row], path: Path) -> Path:
    """FID of the EMA generator over training (mean over seeds, band: min-max) and the hinge
    losses (mean over seeds, running mean of 8 logged points) per arm, as one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    for row in rows:
        name = ARM_TITLES.get(arm_of(row), arm_of(row))
        series: dict[str, dict[int, list[float]]] = {"eval/fid": {}, "loss/d": {}, "loss/g": {}}
        for job in row.jobs:
            for entry in _curves(job):
                for key, table in series.items():
                    if key in entry:
                        table.setdefault(int(entry["step"]), []).append(float(entry[key]))
        for ax, key in zip(axes, series, strict=True):
            steps = sorted(series[key])
            if not steps:
                continue
            means = [statistics.fmean(series[key][s]) for s in steps]
            if key != "eval/fid":
                means = [statistics.fmean(means[max(0, i - 7) : i + 1]) for i in range(len(means))]
            (line,) = ax.plot(steps, means, label=name)
            if key == "eval/fid":
                low = [min(series[key][s]) for s in steps]
                high = [max(series[key][s]) for s in steps]
                ax.fill_between(steps, low, high, color=line.get_color(), alpha=0.15)
    titles = ("FID (EMA G, curve samples)", "D hinge loss", "G loss")
    for ax, title in zip(axes, titles, strict=True):
        ax.set_title(title)
        ax.set_xlabel("step")
    if axes[0].get_legend_handles_labels()[0]:
        axes[0].set_yscale("log")
        axes[0].legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def copy_grids(rows: Sequence[Row], figures: Path) -> dict[str, tuple[Path, str]]:
    """Each arm's seed-0 sample grid (the first finished job when seed 0 is missing), copied
    to ``figures/<arm>.png``: arm -> (the copy, the seed it comes from)."""
    out = {}
    for row in rows:
        done = [j for j in row.jobs if (j.directory / "samples.png").exists()]
        if not done:
            continue
        done.sort(key=lambda j: j.overrides.get("seed", "0") != "0")
        target = figures / f"{arm_of(row)}.png"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(done[0].directory / "samples.png", target)
        out[arm_of(row)] = (target, done[0].overrides.get("seed", "0"))
    return out


def real_grid(path: Path, columns: int = 8) -> Path:
    """A grid of real validation canvases for comparison."""
    from experiments.data.twin_digits import TwinDigitsDataset
    from experiments.generation.evaluate import save_grid

    return save_grid(TwinDigitsDataset("val", columns * columns).canvases, path, columns)


def _settings(rows: Sequence[Row]) -> Mapping[str, Any]:
    for row in rows:
        results = _results(row)
        if results:
            return results[0]
    return {}


def _arm_config(rows: Sequence[Row], arm: str) -> Mapping[str, Any]:
    """The saved config of the first finished job of ``arm`` ({} when none)."""
    row = next((r for r in rows if arm_of(r) == arm), None)
    results = _results(row) if row is not None else []
    return results[0].get("config", {}) if results else {}


@dataclass(frozen=True)
class GenerationPage:
    """Everything ``docs/generation.md`` says. ``config``: the first finished job's config
    (the settings every job shares); ``ham``: the Hamburger arm's ``context`` config;
    ``done`` of ``total`` jobs finished; ``accuracy``: the metrics classifier's held-out
    accuracy; ``span_minutes``: the sweep's wall-clock; ``parallel_jobs``: its launcher's;
    figure paths relative to the page (``grids``: title, arm, path, seed); the networks'
    layout from their modules."""

    verdict: Verdict
    metrics: Table
    cost: Table
    failed: Table
    config: Mapping[str, Any]
    ham: Mapping[str, Any]
    done: int
    total: int
    accuracy: float | None
    span_minutes: float | None
    parallel_jobs: Any
    grids: tuple[tuple[str, str, str, str], ...]
    real: str
    curves: str
    command: str
    context_size: int
    canvas: int
    digit: int
    features: int
    confidence: float
    paper_fid: Mapping[str, float]
    paper_resolution: int

    @property
    def grid_seeds(self) -> tuple[str, ...]:
        """The seeds the sample grids come from (each once, in order)."""
        return tuple(dict.fromkeys(seed for *_, seed in self.grids))


def write_generation_report(
    sweep_dir: str | Path, output: str | Path = "docs/generation.md", command: str = ""
) -> Path:
    """Write the report of the sweep in ``sweep_dir`` to ``output``; figures go to the folder
    named like ``output`` without its suffix (``docs/generation/``)."""
    sweep_dir = Path(sweep_dir)
    jobs = collect_jobs(sweep_dir)
    rows = ordered_rows(jobs)
    output = Path(output)
    figures = output.with_suffix("")
    grids = copy_grids(rows, figures)
    real = real_grid(figures / "real.png")
    curves = plot_curves(rows, figures / "curves.png")
    first = _settings(rows)
    base = output.parent
    span = sweep_span_s(sweep_dir)
    page = GenerationPage(
        verdict=verdict_data(rows),
        metrics=metrics_table(rows),
        cost=cost_table(rows),
        failed=failures(jobs),
        config=first.get("config", {}),
        ham=_arm_config(rows, "nmf_one_step").get("context", {}),
        done=sum(job.status == "ok" for job in jobs),
        total=max(planned_jobs(sweep_dir) or 0, len(jobs)),
        accuracy=first.get("classifier_accuracy"),
        span_minutes=None if span is None else span / 60,
        parallel_jobs=parallel_jobs(sweep_dir),
        grids=tuple(
            (ARM_TITLES.get(arm, arm), arm, path.relative_to(base).as_posix(), seed)
            for arm, (path, seed) in grids.items()
        ),
        real=real.relative_to(base).as_posix(),
        curves=curves.relative_to(base).as_posix(),
        command=command or "make generate",
        context_size=CONTEXT_SIZE,
        canvas=CANVAS,
        digit=DIGIT,
        features=2 * FEATURES,
        confidence=inspect.signature(consistency).parameters["threshold"].default,
        paper_fid=PAPER_FID,
        paper_resolution=PAPER_RESOLUTION,
    )
    output.write_text(render("generation/page.md.j2", page=page), encoding="utf-8")
    logger.info("wrote %s (%d jobs)", output, len(jobs))
    return output
