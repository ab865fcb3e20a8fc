"""``docs/generation.md`` from the results file of ``experiments.generation.study`` alone.

The results file (one JSON row per finished job: its definition, final metrics, eval curve,
gamma(t), cost, plateau flag) gives every number; the design facts come from the jobs'
definitions, the data layout (``experiments.data.far_twins``) and a receptive-field probe of the
networks built from those definitions (``experiments.generation.receptive``). Figures (curves,
gates, sample grids) go beside the page in ``docs/generation/``; the sample grids are copied from
the sweep folder when it holds them (seed 0's), else the committed ones are kept.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import shutil
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from experiments.data.far_twins import DIGIT, LEFT, OFFSET, RIGHT, TOP, FarTwinsDataset
from experiments.generation.evaluate import save_grid
from experiments.generation.job import ARMS, GanJob, build_networks
from experiments.generation.paired import PairedInterval, compare, pilot_gate
from experiments.generation.receptive import discriminator_field, generator_field
from experiments.generation.study import PILOT_ARMS, PILOT_SEEDS, RESULTS, phase_jobs, read_rows
from experiments.reports.render import Table, render

logger = logging.getLogger(__name__)

ARM_TITLES = {
    "none": "no context",
    "self_attention": "self-attention (SAGAN)",
    "nmf_one_step": "Hamburger NMF, one-step (HamGAN)",
    "nmf_unroll": "Hamburger NMF, BPTT",
    "vq_one_step": "Hamburger VQ, one-step",
}
METRICS = (("fid", "FID ↓", 2), ("kid", "KID ↓", 4), ("precision", "precision ↑", 3),
           ("recall", "recall ↑", 3), ("consistency", "consistency ↑", 3),
           ("kappa", "kappa ↑", 3))  # fmt: skip
COMPARISONS = (
    ("self_attention", "none"),
    ("nmf_one_step", "none"),
    ("nmf_unroll", "none"),
    ("vq_one_step", "none"),
    ("nmf_one_step", "self_attention"),
    ("nmf_unroll", "nmf_one_step"),
    ("vq_one_step", "nmf_one_step"),
)
VERDICT_METRICS = ("kappa", "fid")
HISTORY_FILE = "history.jsonl"  # beside the results file: rows of earlier designs
PAIRING_FILE = "pairing_check.json"  # beside the results file: experiments.generation.pairing_check


@dataclass(frozen=True)
class Design:
    """The task's and networks' facts, from a job definition and the probe."""

    job: GanJob
    canvas: int
    digit: int
    top: int
    left: int
    right: int
    offset: int
    g_cells: int
    g_pixels: int
    g_share: bool
    g_share_context: bool
    d_pixels: int
    d_both: bool
    d_both_context: bool


@dataclass(frozen=True)
class EarlierDesign:
    """A design tried before the current one (rows of the history file): what differed from
    the current job definition, and its jobs' final numbers."""

    changes: str
    jobs: Table


@dataclass(frozen=True)
class GenerationPage:
    """Everything the template writes."""

    design: Design
    command: str
    rows_total: int
    gate: Any
    pilot: Table
    main_done: int
    main_total: int
    metrics: Table
    comparisons: Table
    verdicts: tuple[PairedInterval, ...]
    plateau: Table
    not_plateaued: tuple[str, ...]
    cost: Table
    grids: tuple[tuple[str, str], ...]
    classifier_accuracy: float | None
    history: tuple[EarlierDesign, ...]
    job_minutes: float
    pairing: Table | None = None


def design_of(job: GanJob) -> Design:
    """The design facts of ``job``'s networks: probe the no-context and self-attention nets
    (cached per network definition: the probe takes seconds)."""
    return _design(tuple(sorted(_shared(job).items())))


@functools.cache
def _design(shared: tuple[tuple[str, Any], ...]) -> Design:
    job = GanJob("none", 0, **dict(shared))
    local = {
        arm: build_networks(GanJob(arm, 0, **dict(shared))) for arm in ("none", "self_attention")
    }
    g_none, g_sa = (generator_field(local[a][0]) for a in ("none", "self_attention"))
    d_none, d_sa = (discriminator_field(local[a][1]) for a in ("none", "self_attention"))
    return Design(job, 32, DIGIT, TOP, LEFT, RIGHT, OFFSET, g_none.cells, g_none.pixels,
                  g_none.digits_share_input, g_sa.digits_share_input, d_none.pixels,
                  d_none.sees_both_digits, d_sa.sees_both_digits)  # fmt: skip


def _shared(job: GanJob) -> dict[str, Any]:
    return {k: v for k, v in job.definition().items() if k not in ("arm", "seed")}


def _mean_std(values: Sequence[float]) -> str:
    if not values:
        return "–"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):.4g} ± {sd:.2g}"


def _arm_rows(rows: Sequence[Mapping[str, Any]], arm: str) -> list[Mapping[str, Any]]:
    return sorted(
        (r for r in rows if r["definition"]["arm"] == arm), key=lambda r: r["definition"]["seed"]
    )


def metrics_table(rows: Sequence[Mapping[str, Any]]) -> Table:
    """Mean ± std over seeds per arm, then the real data's reference row."""
    body: list[list[Any]] = []
    for arm in ARMS:
        mine = _arm_rows(rows, arm)
        if mine:
            body.append(
                [
                    ARM_TITLES[arm],
                    len(mine),
                    *(_mean_std([float(r[k]) for r in mine]) for k, _, _ in METRICS),
                ]
            )
    if rows:
        ref = rows[0]["reference"]
        body.append(
            ["real data (reference)", "–", *(f"{float(ref[k]):.4g}" for k, _, _ in METRICS)]
        )
    return Table.of(["arm", "seeds", *(title for _, title, _ in METRICS)], body)


def pilot_table(rows: Sequence[Mapping[str, Any]]) -> Table:
    """Kappa, consistency, FID and the discriminator's mismatch gap (``d_probe``) per pilot
    seed of both pilot arms, and the paired difference of kappa."""
    body = []
    for seed in PILOT_SEEDS:
        cells: list[Any] = [seed]
        values = {}
        for arm in PILOT_ARMS:
            row = next(
                (
                    r
                    for r in rows
                    if r["definition"]["arm"] == arm and r["definition"]["seed"] == seed
                ),
                None,
            )
            values[arm] = None if row is None else float(row["kappa"])
            gap = None if row is None else row.get("d_mismatch_gap")
            cells += [values[arm], None if row is None else float(row["consistency"]),
                      None if row is None else float(row["fid"]), gap]  # fmt: skip
        both = None not in values.values()
        cells.append(values["self_attention"] - values["none"] if both else None)  # type: ignore[operator]
        body.append(cells)
    header = ["seed", "kappa, none", "consistency, none", "FID, none", "D gap, none",
              "kappa, self-attention", "consistency, self-attention", "FID, self-attention",
              "D gap, self-attention", "Δ kappa"]  # fmt: skip
    return Table.of(header, body)


def comparison_table(rows: Sequence[Mapping[str, Any]]) -> tuple[Table, tuple[PairedInterval, ...]]:
    """Paired differences a - b (mean, 95 % interval, verdict for a) per pair and metric."""
    body, verdicts = [], []
    for a, b in COMPARISONS:
        for metric, title, digits in METRICS:
            interval = compare(rows, a, b, metric)
            if interval is None:
                continue
            body.append([f"{ARM_TITLES[a]} − {ARM_TITLES[b]}", title, interval.n,
                         f"{interval.mean:+.{digits}f}",
                         f"[{interval.low:+.{digits}f}, {interval.high:+.{digits}f}]",
                         interval.verdict])  # fmt: skip
            if metric in VERDICT_METRICS:
                verdicts.append(interval)
    header = ["a − b", "metric", "seeds", "mean", "95 % interval", "verdict for a"]
    return Table.of(header, body), tuple(verdicts)


def plateau_table(rows: Sequence[Mapping[str, Any]]) -> tuple[Table, tuple[str, ...]]:
    """Per arm: jobs at a plateau, the relative FID change over the last window per seed."""
    body, missing = [], []
    for arm in ARMS:
        mine = _arm_rows(rows, arm)
        if not mine:
            continue
        flat = sum(bool(r["plateau"]) for r in mine)
        changes = ", ".join(f"{100 * float(r['fid_change_last']):.1f} %" for r in mine)
        body.append([ARM_TITLES[arm], f"{flat}/{len(mine)}", changes])
        if flat < len(mine):
            missing.append(ARM_TITLES[arm])
    return Table.of(
        ["arm", "at a plateau", "FID change over the last window, by seed"], body
    ), tuple(missing)


def cost_table(rows: Sequence[Mapping[str, Any]]) -> Table:
    """Parameters, time per training step, peak memory of the job process, dropped updates."""
    body = []
    for arm in ARMS:
        mine = _arm_rows(rows, arm)
        if not mine:
            continue
        first = mine[0]
        body.append([
            ARM_TITLES[arm], f"{first['params_g']:,}", f"{first['params_d']:,}",
            f"{first['params_context']:,}",
            _mean_std([1000 * float(r["time_per_step_s"]) for r in mine]),
            _mean_std([float(r["peak_rss_mib"]) for r in mine]),
            _mean_std([float(r["peak_rss_mib"]) - float(r["rss_before_mib"]) for r in mine]),
            sum(int(r["skipped_updates"]) for r in mine),
        ])  # fmt: skip
    header = ["arm", "G params", "D params", "context params (G + D)", "ms / step",
              "peak RSS (MiB)", "peak RSS above start (MiB)", "dropped updates"]  # fmt: skip
    return Table.of(header, body)


def plot_curves(rows: Sequence[Mapping[str, Any]], out_dir: Path) -> None:
    """``curves.png`` (FID and consistency of the eval samples vs step) and ``gates.png``
    (gamma of G's and D's context gate vs step); one line per job, one colour per arm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = dict(
        zip(ARMS, ("tab:gray", "tab:blue", "tab:orange", "tab:red", "tab:green"), strict=True)
    )
    panels = (
        ("curves.png", "curve", ("fid", "kappa", "consistency")),
        ("gates.png", "gates", ("gamma_g", "gamma_d")),
    )
    for name, key, series in panels:
        fig, axes = plt.subplots(1, len(series), figsize=(5.5 * len(series), 4))
        for ax, metric in zip(axes, series, strict=True):
            for arm in ARMS:
                for i, row in enumerate(_arm_rows(rows, arm)):
                    points = row[key]
                    steps, values = [p["step"] for p in points], [p[metric] for p in points]
                    label = ARM_TITLES[arm] if i == 0 else None
                    ax.plot(steps, values, color=colours[arm], alpha=0.7, lw=1, label=label)
            ax.set_xlabel("step")
            ax.set_ylabel(metric)
            if metric == "fid":
                ax.set_yscale("log")
        axes[0].legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out_dir / name, dpi=90)
        plt.close(fig)


def copy_grids(sweep_dir: Path, out_dir: Path, arms: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """Seed 0's sample grid of each of ``arms`` (those with rows) from the sweep (the committed
    one kept when the sweep lacks it), and the real held-out canvases' grid; returns (title,
    file name) of those present."""
    grids = []
    for arm in arms:
        source, target = sweep_dir / f"{arm}_seed0" / "samples.png", out_dir / f"{arm}.png"
        if source.exists():
            shutil.copyfile(source, target)
        if target.exists():
            grids.append((ARM_TITLES[arm], target.name))
    save_grid(FarTwinsDataset("val", 64).canvases, out_dir / "real.png", columns=8)
    grids.append(("real (held-out digits)", "real.png"))
    return tuple(grids)


def current_rows(
    rows: Sequence[Mapping[str, Any]], jobs: Sequence[GanJob]
) -> list[Mapping[str, Any]]:
    """The rows of ``jobs`` as they are defined now (rows of other definitions are left out)."""
    definitions = {job.name: job.definition() for job in jobs}
    return [r for r in rows if definitions.get(r["job"]) == r["definition"]]


def earlier_designs(
    history: Sequence[Mapping[str, Any]], current: GanJob
) -> tuple[EarlierDesign, ...]:
    """The history rows grouped by design (their definitions without arm and seed), each with
    the fields that differ from ``current`` and a table of its jobs."""
    now = _shared(current)
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for row in history:
        shared = {k: v for k, v in row["definition"].items() if k not in ("arm", "seed")}
        groups.setdefault(repr(sorted(shared.items())), []).append(row)
    designs = []
    for members in groups.values():
        old = members[0]["definition"]
        diffs = [f"{k} {old.get(k, '–')} → {now[k]}" for k in now if old.get(k) != now[k]]
        body = [[ARM_TITLES[r["definition"]["arm"]], r["definition"]["seed"], float(r["fid"]),
                 float(r["precision"]), float(r["recall"]), float(r["consistency"]),
                 f"{100 * float(r['fid_change_last']):.1f} %"] for r in members]  # fmt: skip
        ref = members[0]["reference"]
        body.append(["real data (reference)", "–", float(ref["fid"]), float(ref["precision"]),
                     float(ref["recall"]), float(ref["consistency"]), "–"])  # fmt: skip
        header = ["arm", "seed", "FID", "precision", "recall", "consistency",
                  "FID change, last 20 %"]  # fmt: skip
        designs.append(EarlierDesign(", ".join(diffs) or "none", Table.of(header, body)))
    return tuple(designs)


def build_page(
    rows: Sequence[Mapping[str, Any]],
    sweep_dir: Path,
    figures: Path,
    command: str,
    history: Sequence[Mapping[str, Any]] = (),
    pairing: Sequence[Mapping[str, Any]] = (),
) -> GenerationPage:
    """The page's data from the results rows (figures written to ``figures``) and the
    supervised pairing check's cases (``experiments.generation.pairing_check``)."""
    main_jobs = phase_jobs("main")
    rows = current_rows(rows, main_jobs)
    job = GanJob(**rows[0]["definition"]) if rows else main_jobs[0]
    names = {j.name for j in main_jobs}
    comparisons, verdicts = comparison_table(rows)
    plateau, not_plateaued = plateau_table(rows)
    figures.mkdir(parents=True, exist_ok=True)
    if rows:
        plot_curves(rows, figures)
    return GenerationPage(
        design=design_of(job), command=command, rows_total=len(rows), gate=pilot_gate(rows),
        pilot=pilot_table(rows), main_done=sum(r["job"] in names for r in rows),
        main_total=len(main_jobs), metrics=metrics_table(rows), comparisons=comparisons,
        verdicts=verdicts, plateau=plateau, not_plateaued=not_plateaued, cost=cost_table(rows),
        grids=copy_grids(sweep_dir, figures, [a for a in ARMS if _arm_rows(rows, a)]),
        classifier_accuracy=float(rows[0]["classifier_accuracy"]) if rows else None,
        history=earlier_designs(history, job),
        job_minutes=sum(float(r.get("wall_s", 0.0)) for r in rows) / 60,
        pairing=pairing_table(pairing),
    )  # fmt: skip


def pairing_table(cases: Sequence[Mapping[str, Any]]) -> Table | None:
    """One row per pairing-check case: arm, initial gamma, steps, val accuracy at the start, the
    middle and the end, final gamma (None without cases)."""
    if not cases:
        return None
    body = []
    for case in cases:
        curve = case["curve"]
        body.append([ARM_TITLES[case["arm"]], float(case["d_gate_init"]), int(case["steps"]),
                     float(curve[0]["val_accuracy"]), float(curve[len(curve) // 2]["val_accuracy"]),
                     float(curve[-1]["val_accuracy"]), float(curve[-1]["gamma"])])  # fmt: skip
    header = ["discriminator's context", "initial γ", "steps", "val accuracy, start", "middle",
              "end", "final γ"]  # fmt: skip
    return Table.of(header, body)


def write_generation_report(sweep_dir: str | Path, out: str | Path, command: str,
                            results: str | Path = RESULTS) -> Path:  # fmt: skip
    """Write ``out`` (and its figures in ``<out without .md>/``) from ``results`` (and the
    earlier designs' rows in ``history.jsonl`` beside it, when there)."""
    out = Path(out)
    rows = read_rows(results)
    if not all(math.isfinite(float(r["fid"])) for r in rows):
        logger.warning("some jobs have a non-finite FID")
    history = read_rows(Path(results).with_name(HISTORY_FILE))
    pairing_file = Path(results).with_name(PAIRING_FILE)
    pairing = json.loads(pairing_file.read_text()) if pairing_file.exists() else []
    page = build_page(rows, Path(sweep_dir), out.with_suffix(""), command, history, pairing)
    out.write_text(render("generation/page.md.j2", page=page, figures=out.with_suffix("").name))
    logger.info("wrote %s from %d result rows", out, len(rows))
    return out
