"""Plots of the diagnostics, written as PNG with matplotlib's Agg canvas.

Figures are built with ``matplotlib.figure.Figure`` directly (no pyplot, no global backend
switch), so plotting works headless and never touches the user's interactive state. Every
function draws on ``ax`` when given (to compose figures) or on a new figure, saves it to
``path`` when given, and returns the figure. matplotlib is not a dependency of the library
(it comes with the experiments extra): a plot without it raises an ImportError that says so.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from torch import Tensor

from implicit_ham.diagnostics.convergence import ConvergenceTrace

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


def _axes(ax: Axes | None, panels: int = 1) -> list[Axes]:
    if ax is not None:
        return [ax]
    try:
        from matplotlib.figure import Figure
    except ImportError as err:
        raise ImportError(
            "the diagnostics' plots need matplotlib, which the library does not depend on: "
            "pip install matplotlib (the experiments extra includes it)"
        ) from err

    fig = Figure(figsize=(4.5 * panels, 3.4), layout="constrained")
    return list(fig.subplots(1, panels, squeeze=False)[0])


def _finish(fig: Figure, path: str | Path | None) -> Figure:
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=120)
    return fig


def plot_residuals(
    traces: Mapping[str, ConvergenceTrace | Tensor],
    *,
    relative: bool = True,
    ax: Axes | None = None,
    path: str | Path | None = None,
) -> Figure:
    """Residual vs iteration, one line per solver (worst sample of the batch), log scale.

    Args:
        traces: label -> ``ConvergenceTrace`` or a (steps, B) / (steps,) residual tensor.
        relative: plot the relative residual of a ``ConvergenceTrace`` (else the absolute).
    """
    (axis,) = _axes(ax)
    for label, trace in traces.items():
        if isinstance(trace, ConvergenceTrace):
            trace = trace.rel_residuals if relative else trace.residuals
        worst = trace.reshape(trace.shape[0], -1).amax(dim=1).detach().cpu()
        axis.semilogy(range(1, len(worst) + 1), worst.tolist(), label=label)
    axis.set_xlabel("iteration")
    axis.set_ylabel("relative residual" if relative else "residual")
    axis.set_title("forward convergence")
    axis.legend(fontsize="small")
    return _finish(cast("Figure", axis.figure), path)


def plot_grad_vs_k(
    rows: Sequence[Mapping[str, Any]],
    *,
    axes: Sequence[Axes] | None = None,
    path: str | Path | None = None,
) -> Figure:
    """Gradient norm (left) and cosine to the reference (right) vs K, one line per adjoint.

    Args:
        rows: ``grad_vs_k`` rows (keys adjoint, K, grad_norm, cosine, ref_grad_norm).
        axes: two axes to draw on.
    """
    left, right = axes if axes is not None else _axes(None, panels=2)
    labels = list(dict.fromkeys(str(r["adjoint"]) for r in rows))
    for label in labels:
        mine = sorted((r for r in rows if r["adjoint"] == label), key=lambda r: r["K"])
        ks = [r["K"] for r in mine]
        left.semilogy(ks, [r["grad_norm"] for r in mine], marker="o", label=label)
        right.plot(ks, [r["cosine"] for r in mine], marker="o", label=label)
    ref = next((r.get("ref_grad_norm") for r in rows), None)
    if ref is not None and math.isfinite(ref) and ref > 0:
        left.axhline(ref, color="gray", linestyle="--", label="fixed-point gradient")
    left.set_xlabel("K (iterations)")
    left.set_ylabel("gradient norm")
    right.set_xlabel("K (iterations)")
    right.set_ylabel("cosine to fixed-point gradient")
    left.legend(fontsize="small")
    right.legend(fontsize="small")
    return _finish(cast("Figure", left.figure), path)


def plot_conditioning_history(
    rows: Sequence[Mapping[str, Any]],
    *,
    axes: Sequence[Axes] | None = None,
    path: str | Path | None = None,
) -> Figure:
    """Spectral radius of J (left) and κ(I - J) (right, log scale) over training steps.

    Args:
        rows: logged metric rows, each with "step" and keys ending in "/spectral_radius" or
            "/kappa" (as ``DiagnosticsCallback`` logs them); one line per key prefix.
    """
    left, right = axes if axes is not None else _axes(None, panels=2)
    for suffix, axis in (("spectral_radius", left), ("kappa", right)):
        keys = sorted({k for r in rows for k in r if k.endswith("/" + suffix)})
        for key in keys:
            points = [(r["step"], r[key]) for r in rows if key in r and r[key] is not None]
            axis.plot(
                [p[0] for p in points],
                [p[1] for p in points],
                marker=".",
                label=key.rsplit("/", 1)[0],
            )
        axis.set_xlabel("step")
        if keys:
            axis.legend(fontsize="small")
    left.set_ylabel("spectral radius of J")
    right.set_ylabel("κ(I - J)")
    right.set_yscale("log")
    return _finish(cast("Figure", left.figure), path)
