"""PNG plots of a sweep report: a metric per group (bars with std) and per epoch (curves)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from matplotlib.figure import Figure

from experiments.reports.sweep import label
from experiments.reports.sweep_jobs import Row

INCH_PER_CHAR = 0.075  # a tick / legend label's width per character at the default font size


def bar_figure(rows: Sequence[Row], metric: str, keys: Sequence[str] | None = None) -> Figure:
    """Horizontal bars of ``metric`` (mean ± std over seeds), one per row, labelled by the
    overrides in ``keys`` (``label``); the figure is widened to fit its longest label."""
    shown = [
        (label(row.overrides, keys), s) for row in rows if (s := row.mean_std(metric)) is not None
    ]
    longest = max((len(name) for name, _ in shown), default=0)
    fig = Figure(figsize=(5 + INCH_PER_CHAR * longest, 0.45 * len(shown) + 1.2))
    ax = fig.subplots()
    ax.barh(
        [name for name, _ in shown],
        [s[0] for _, s in shown],
        xerr=[s[1] for _, s in shown],
        color="tab:blue",
        alpha=0.8,
    )
    ax.invert_yaxis()
    ax.set_xlabel(metric)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return fig


def plot_metric_bars(
    rows: Sequence[Row], metric: str, path: str | Path, keys: Sequence[str] | None = None
) -> Path:
    """``bar_figure`` saved to ``path``."""
    bar_figure(rows, metric, keys).savefig(path, dpi=110)
    return Path(path)


def plot_curves(
    rows: Sequence[Row], metric: str, path: str | Path, keys: Sequence[str] | None = None
) -> Path:
    """``metric`` per epoch, averaged over each row's seeds, one line per row labelled by the
    overrides in ``keys``; the legend sits right of the axes, the figure widened to fit it;
    saved to ``path``."""
    names = [label(row.overrides, keys) for row in rows]
    fig = Figure(figsize=(6 + INCH_PER_CHAR * max(map(len, names), default=0), 4))
    ax = fig.subplots()
    for row in rows:
        per_epoch: dict[int, list[float]] = defaultdict(list)
        for job in row.jobs:
            for entry in job.history:
                if isinstance(entry.get(metric), (int, float)):
                    per_epoch[int(entry["epoch"])].append(float(entry[metric]))
        if per_epoch:
            epochs = sorted(per_epoch)
            means = [sum(per_epoch[e]) / len(per_epoch[e]) for e in epochs]
            ax.plot(epochs, means, marker="o", label=label(row.overrides, keys))
    ax.set_xlabel("epoch")
    ax.set_ylabel(metric)
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return Path(path)
