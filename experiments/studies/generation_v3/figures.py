"""The generation v3 page's learning curves and compute summary, read from the results rows.

Each row carries its curve (``[[step, value], ...]``: held-out loss for the main arms, held-out
balanced accuracy for the pairing check) and its job time; the figures average the curves of an
arm's seeds step by step, so the page shows whether every arm trained to its plateau.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from experiments.studies.generation_v3.plan import ARMS
from experiments.studies.job_costs import fastest


def mean_curve(rows: Sequence[Mapping[str, Any]]) -> tuple[list[int], list[float]]:
    """The rows' curves averaged step by step over the rows that reached the step (steps of
    the longest curve)."""
    curves = [[(int(step), float(value)) for step, value in r["curve"]] for r in rows]
    longest = max(curves, key=len, default=[])
    steps = [step for step, _ in longest]
    values = [statistics.fmean(c[i][1] for c in curves if i < len(c)) for i in range(len(steps))]
    return steps, values


def curve_figure(
    rows: Sequence[Mapping[str, Any]], arms: Sequence[str], ylabel: str, path: Path
) -> Path:
    """One line per arm (the mean over its rows' seeds, ``mean_curve``) against the training
    step, saved as a PNG at ``path``; arms without rows are left out."""
    fig = Figure(figsize=(6.5, 3.8))
    ax = fig.subplots()
    for arm in arms:
        mine = [r for r in rows if r["arm"] == arm and r["curve"]]
        if mine:
            steps, values = mean_curve(mine)
            ax.plot(steps, values, label=f"{ARMS[arm][1]} ({len(mine)} seeds)")
    ax.set_xlabel("training step")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path


def job_minutes(rows: Sequence[Mapping[str, Any]]) -> float:
    """The rows' training time summed, in minutes (one thread a job)."""
    return sum(float(r["train_time_s"]) for r in rows) / 60


def projected_minutes(rows: Sequence[Mapping[str, Any]], jobs_per_arm: int) -> float:
    """Job minutes of ``jobs_per_arm`` jobs of every arm in ``rows``, each at its arm's fastest
    measured job (the time at the lowest load it met: a projection for idle cores that still
    overstates them when every job of an arm ran under load)."""
    per_arm = fastest(rows, lambda r: str(r["arm"]), lambda r: float(r["train_time_s"]))
    return sum(per_arm.values()) * jobs_per_arm / 60
