"""Plots: PNG files are written and the drawn data are the diagnostics' numbers."""

from __future__ import annotations

import importlib.util
import sys

import pytest
import torch

import implicit_ham as ih
from implicit_ham.diagnostics import (
    convergence_trace,
    grad_vs_k,
    plot_conditioning_history,
    plot_grad_vs_k,
    plot_residuals,
)

F64 = torch.float64
needs_matplotlib = pytest.mark.skipif(
    importlib.util.find_spec("matplotlib") is None,
    reason="matplotlib is not a library dependency (pip install matplotlib)",
)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _problem() -> ih.FixedPointProblem:
    a = torch.tensor([0.5, 0.8], dtype=F64)
    x = torch.tensor([1.0, -2.0], dtype=F64, requires_grad=True)
    return ih.FixedPointProblem(lambda z, x: a * z + x, torch.zeros(2, dtype=F64), (x,))


@needs_matplotlib
def test_residual_plot_draws_worst_sample_per_solver(tmp_path) -> None:
    problem = _problem()
    traces = {
        "fpi": convergence_trace(problem, ih.FixedPointIteration(max_steps=10)),
        "raw": torch.tensor([[1.0, 2.0], [0.5, 0.1]]),
    }
    fig = plot_residuals(traces, path=tmp_path / "res.png")
    assert (tmp_path / "res.png").read_bytes()[:8] == PNG_MAGIC
    lines = fig.axes[0].get_lines()
    assert [line.get_label() for line in lines] == ["fpi", "raw"]
    expected = traces["fpi"].rel_residuals.amax(dim=1).tolist()
    assert list(lines[0].get_ydata()) == expected
    assert list(lines[1].get_ydata()) == [2.0, 0.5]


@needs_matplotlib
def test_grad_vs_k_plot_has_one_line_per_adjoint(tmp_path) -> None:
    rows = grad_vs_k(
        _problem(), lambda z: z.sum(), [1, 2, 4], {"unroll": ih.Unroll(), "one": ih.OneStep()}
    )
    fig = plot_grad_vs_k(rows, path=tmp_path / "k.png")
    assert (tmp_path / "k.png").read_bytes()[:8] == PNG_MAGIC
    left, right = fig.axes
    norms = next(line for line in left.get_lines() if line.get_label() == "unroll")
    assert list(norms.get_ydata()) == [r["grad_norm"] for r in rows if r["adjoint"] == "unroll"]
    assert [line.get_label() for line in right.get_lines()] == ["unroll", "one"]


@needs_matplotlib
def test_conditioning_history_plot_reads_logged_rows(tmp_path) -> None:
    rows = [
        {"step": 0, "cond/ham/spectral_radius": 0.9, "cond/ham/kappa": 10.0, "loss": 1.0},
        {"step": 50, "loss": 0.5},
        {"step": 100, "cond/ham/spectral_radius": 0.99, "cond/ham/kappa": 1e5},
    ]
    fig = plot_conditioning_history(rows, path=tmp_path / "c.png")
    assert (tmp_path / "c.png").read_bytes()[:8] == PNG_MAGIC
    left, right = fig.axes
    (rho,) = left.get_lines()
    assert rho.get_label() == "cond/ham" and list(rho.get_xdata()) == [0, 100]
    assert list(right.get_lines()[0].get_ydata()) == [10.0, 1e5]
    assert right.get_yscale() == "log"


def test_a_plot_without_matplotlib_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now fails
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    traces = {"raw": torch.tensor([[1.0, 2.0], [0.5, 0.1]])}
    with pytest.raises(ImportError, match=r"plots need matplotlib.*pip install matplotlib"):
        plot_residuals(traces)
