"""A DEQ whose every backward is taken at a point that is not a fixed point, trained 100 steps
in plain PyTorch: a handful of warnings, every event counted."""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import pytest
import torch
from torch import nn

import implicit_ham as ih


def test_a_hundred_bad_steps_emit_a_handful_of_warnings_and_count_every_event() -> None:
    torch.manual_seed(0)
    cell_w, cell_u = nn.Linear(8, 8, bias=False), nn.Linear(8, 8)
    with torch.no_grad():
        cell_w.weight.mul_(4.0)  # far from contractive

    def f(z: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(cell_w(z) + cell_u(x))

    opt = torch.optim.SGD([*cell_w.parameters(), *cell_u.parameters()], lr=1e-3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        for _ in range(100):
            x = torch.randn(4, 8)
            sol = ih.fixed_point(f, torch.zeros(4, 8), x,
                                 solver=ih.FixedPointIteration(max_steps=3, tol=1e-6),
                                 adjoint=ih.Implicit(max_steps=5))
            opt.zero_grad()
            sol.value.sum().backward()
            opt.step()
    ours = [w for w in caught if issubclass(w.category, (ih.ConvergenceWarning,))]
    summary = ih.diagnostics.events().summary()
    assert summary["by_kind"]["NotFixedPointWarning"] == 100
    assert summary["by_kind"]["ConvergenceWarning"] >= 100  # every forward missed its tol
    assert len(ours) <= 6  # the first of each (kind, source), then one summary per 100
    summaries = [str(w.message) for w in ours if "rate-limited" in str(w.message)]
    assert summaries and "worst residual" in summaries[0]


class _Cell(nn.Module):
    """The issue's DEQ ``z = tanh(W z + U x)`` as an implicit layer (it has an ``adjoint``)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.W, self.U = nn.Linear(width, width, bias=False), nn.Linear(width, width)
        with torch.no_grad():
            self.W.weight.mul_(0.46 / torch.linalg.matrix_norm(self.W.weight, ord=2))
        self.solver = ih.FixedPointIteration(max_steps=30, tol=1e-4)
        self.adjoint = ih.Implicit()

    def f(self, z: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.W(z) + self.U(x))

    def forward(self, x: torch.Tensor) -> ih.Solution:
        return ih.fixed_point(self.f, torch.zeros_like(x), x, solver=self.solver,
                              adjoint=self.adjoint)


@pytest.fixture
def one_thread() -> Iterator[None]:
    """Small matmuls: one intra-op thread (several only contend on a loaded machine)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def test_the_issues_run_adam_from_a_contractive_start_warns_a_handful_of_times(
    one_thread: None,
) -> None:
    """The case of the issue: from ||W||_2 = 0.46, 100 Adam steps at lr 1e-2 make the map
    lose contractivity (||W||_2 > 2); from then on every forward misses its tolerance and every
    implicit gradient is taken at a non-fixed point. Every event is counted (checked against an
    independent count: the solver's flag and the residual recomputed at the solution), per
    layer and in total, and only a handful of warnings are shown."""
    torch.manual_seed(0)
    cell, head = _Cell(16), nn.Linear(16, 4)
    opt = torch.optim.Adam([*cell.parameters(), *head.parameters()], lr=1e-2)
    x, y = torch.randn(64, 16), torch.randint(0, 4, (64,))
    misses = not_fixed = 0
    fixed_point_tol = cell.adjoint.fixed_point_tol
    with warnings.catch_warnings(record=True) as caught, ih.diagnostics.label_events(cell, "deq"):
        warnings.simplefilter("default")
        for _ in range(100):
            sol = cell(x)
            z = sol.value.detach()
            with torch.no_grad():
                fz = cell.f(z, x)
            misses += not bool(sol.stats.converged.all())
            not_fixed += float(((fz - z).norm(dim=1) / fz.norm(dim=1)).max()) > fixed_point_tol
            loss = nn.functional.cross_entropy(head(sol.value), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    assert float(torch.linalg.matrix_norm(cell.W.weight.detach(), ord=2)) > 2.0
    assert misses >= 50 and not_fixed >= 50  # the regime of the issue
    summary = ih.diagnostics.events().summary()
    assert summary["by_source"]["deq"]["NotFixedPointWarning"] == not_fixed
    assert summary["by_source"]["deq"]["ConvergenceWarning"] >= misses
    assert summary["total"] == sum(summary["by_source"]["deq"].values())
    ours = [w for w in caught if issubclass(w.category, ih.ConvergenceWarning)]
    assert len(ours) <= 5, [str(w.message)[:80] for w in ours]
