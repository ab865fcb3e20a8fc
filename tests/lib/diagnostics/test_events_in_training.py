"""A DEQ whose every backward is taken at a point that is not a fixed point, trained 100 steps
in plain PyTorch: a handful of warnings, every event counted."""

from __future__ import annotations

import warnings

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
