"""PNG plots of a sweep report: a metric per group (bars with std) and per epoch (curves)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from matplotlib.figure import Figure

from experiments.reports.sweep import Row, label


def plot_metric_bars(rows: Sequence[Row], metric: str, path: str | Path) -> Path:
    """Horizontal bars of ``metric`` (mean ± std over seeds), one per row; saved to ``path``."""
    shown = [(label(row.overrides), s) for row in rows if (s := row.mean_std(metric)) is not None]
    fig = Figure(figsize=(7, 0.45 * len(shown) + 1.2))
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
    fig.savefig(path, dpi=110)
    return Path(path)


def plot_curves(rows: Sequence[Row], metric: str, path: str | Path) -> Path:
    """``metric`` per epoch, averaged over each row's seeds; saved to ``path``."""
    fig = Figure(figsize=(7, 4))
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
            ax.plot(epochs, means, marker="o", label=label(row.overrides))
    ax.set_xlabel("epoch")
    ax.set_ylabel(metric)
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return Path(path)
