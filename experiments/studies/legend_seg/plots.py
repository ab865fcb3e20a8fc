"""The PNG figures of ``docs/results.md`` (one function per figure; each returns its path)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib.ticker
from matplotlib.figure import Figure

from experiments.reports.sweep_jobs import Row
from experiments.studies.legend_seg.data import k_steps, mean_std, select

POINT_STYLE = {"init": "--", "trained": "-"}


def plot_metric_vs_k(
    rows: Sequence[Row],
    contexts: Sequence[str],
    adjoints: Sequence[str],
    ks: Sequence[int],
    metrics: Sequence[str],
    path: str | Path,
) -> Path:
    """Grid (metric x decomposition): metric (mean ± std over seeds) vs K, one line per mode."""
    fig = Figure(figsize=(4 * len(contexts), 3.2 * len(metrics)))
    axes = fig.subplots(len(metrics), len(contexts), squeeze=False)
    for i, metric in enumerate(metrics):
        for j, context in enumerate(contexts):
            ax = axes[i][j]
            for adjoint in adjoints:
                cells = [
                    (k, select(rows, context=context, adjoint=adjoint, **k_steps(k))) for k in ks
                ]
                points = [(k, s) for k, row in cells if (s := mean_std(row, metric)) is not None]
                if points:
                    ax.errorbar(
                        [k for k, _ in points],
                        [s[0] for _, s in points],
                        yerr=[s[1] for _, s in points],
                        marker="o",
                        capsize=3,
                        label=adjoint,
                    )
            ax.set_xscale("log", base=2)
            ax.set_xticks(list(ks), [str(k) for k in ks])
            ax.set_title(f"{context}: {metric}")
            ax.set_xlabel("K (iterations)")
            ax.grid(alpha=0.3)
    _legend(axes[0][0], fontsize=8)
    return _save(fig, path)


def plot_grad_study(
    results: Mapping[str, Mapping[str, Any] | None], title: str, path: str | Path
) -> Path:
    """Three panels from ``run_grad_study`` results keyed "init" / "trained": BPTT gradient
    norm vs K, each mode's cosine to the K-step gradient, and to the reference gradient."""
    fig = Figure(figsize=(15, 3.8))
    axes = fig.subplots(1, 3)
    panels = (
        ("grad_norm", "BPTT gradient norm"),
        ("cosine_same_k", "cosine to Unroll at K"),
        ("cosine", "cosine to the reference"),
    )
    for point, res in results.items():
        if not res:
            continue
        by_mode: dict[str, list[Mapping[str, Any]]] = {}
        for row in res["grad_vs_k"]:
            by_mode.setdefault(row["adjoint"], []).append(row)
        for ax, (column, name) in zip(axes, panels, strict=True):
            for index, (mode, rows) in enumerate(by_mode.items()):
                if column == "grad_norm" and mode != "unroll":
                    continue
                ax.plot(
                    [r["K"] for r in rows],
                    [r.get(column) for r in rows],
                    POINT_STYLE.get(point, "-"),
                    color=f"C{index}",  # one colour per mode; line style: init / trained
                    marker="o",
                    markersize=3,
                    label=f"{mode} ({point})",
                )
            ax.set_title(f"{title}: {name}")
            ax.set_xscale("log", base=2)
            ax.set_xticks(sorted({r["K"] for r in res["grad_vs_k"]}))
            ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
            ax.set_xlabel("K")
            ax.grid(alpha=0.3)
    axes[0].set_yscale("log")
    _legend(axes[2], fontsize=6, ncol=2)
    return _save(fig, path)


def plot_convergence(
    traces: Mapping[str, Mapping[str, Mapping[str, Any] | None]], path: str | Path
) -> Path:
    """Per decomposition (columns): relative residual (top) and objective (bottom) vs iteration
    for each forward solver; ``traces[context][point]`` is a ``run_convergence`` result."""
    contexts = list(traces)
    fig = Figure(figsize=(4.5 * len(contexts), 7))
    axes = fig.subplots(2, len(contexts), squeeze=False)
    for j, context in enumerate(contexts):
        for point, res in traces[context].items():
            if not res:
                continue
            for solver, trace in res.get("traces", {}).items():
                style = POINT_STYLE.get(point, "-")
                label = f"{solver} ({point})"
                axes[0][j].plot(trace["rel_residual"], style, label=label)
                if trace.get("objective"):
                    axes[1][j].plot(trace["objective"], style, label=label)
        axes[0][j].set_yscale("log")
        axes[1][j].set_yscale("log")
        axes[0][j].set_title(f"{context}: relative residual")
        axes[1][j].set_title(f"{context}: objective")
        for ax in axes[:, j]:
            ax.set_xlabel("iteration")
            ax.grid(alpha=0.3)
    _legend(axes[0][0], fontsize=7)
    return _save(fig, path)


def plot_eval_solvers(
    results: Mapping[str, Mapping[str, Any] | None], metric: str, path: str | Path
) -> Path:
    """Bars: ``metric`` of each trained model (one group per decomposition) under each forward
    solver of ``run_convergence``'s ``eval_solvers``."""
    fig = Figure(figsize=(9, 4.6))
    ax = fig.subplots()
    present = {c: r for c, r in results.items() if r and r.get("eval_solvers")}
    width = 0.8 / max(1, max((len(r["eval_solvers"]) for r in present.values()), default=1))
    for i, (_context, res) in enumerate(present.items()):
        for j, row in enumerate(res["eval_solvers"]):
            label = row["solver"] if i == 0 else None
            value = row.get(metric)
            height = float("nan") if value is None else value  # a missing value draws no bar
            ax.bar(i + j * width, height, width, color=f"C{j}", label=label)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(present))], list(present))
    ax.set_ylabel(metric)
    ax.grid(axis="y", alpha=0.3)
    _legend(ax, fontsize=7, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.1))
    return _save(fig, path)


def _legend(ax: Any, **kwargs: Any) -> None:
    """A legend when the axes have labelled artists (none when a study part is missing)."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(**kwargs)


def _save(fig: Any, path: str | Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return Path(path)
