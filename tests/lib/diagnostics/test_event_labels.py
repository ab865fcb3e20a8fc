"""Per-layer event counts in plain PyTorch (no GuardedStep): ``label_events`` /
``attribute_events`` attribute each forward and backward event to the layer it comes from."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import Tensor, nn

import implicit_ham as ih
from implicit_ham._core.events import _SOURCE


class DEQ(nn.Module):
    """``z = tanh(W z + U x)`` solved with a short budget (so a large W misses its tolerance)."""

    def __init__(self, width: int, norm: float, max_steps: int = 3) -> None:
        super().__init__()
        self.W, self.U = nn.Linear(width, width, bias=False), nn.Linear(width, width)
        with torch.no_grad():
            self.W.weight.mul_(norm / torch.linalg.matrix_norm(self.W.weight, ord=2))
        self.adjoint = ih.Implicit(max_steps=5)
        self.solver = ih.FixedPointIteration(max_steps=max_steps, tol=1e-6)
        self.last_solution: ih.Solution | None = None

    def cell(self, z: Tensor, x: Tensor) -> Tensor:
        return torch.tanh(self.W(z) + self.U(x))

    def forward(self, x: Tensor) -> Tensor:
        self.last_solution = ih.fixed_point(
            self.cell, torch.zeros_like(x), x, solver=self.solver, adjoint=self.adjoint
        )
        return self.last_solution.value


def _train(model: nn.Module, steps: int) -> list[dict[str, bool]]:
    """``steps`` forward/backward passes; per step and layer, whether its forward missed the
    tolerance and whether its backward was at a non-fixed point (measured independently: the
    residual recomputed at the solution against the adjoint's fixed_point_tol)."""
    layers = {n: m for n, m in model.named_modules() if isinstance(m, DEQ)}
    seen = []
    torch.manual_seed(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(steps):
            model(torch.randn(4, 8)).square().sum().backward()
            row = {}
            for name, layer in layers.items():
                sol = layer.last_solution
                assert sol is not None
                z = sol.value.detach()
                with torch.no_grad():
                    fz = layer.cell(z, layer.last_input)
                rel = float(((fz - z).norm(dim=1) / fz.norm(dim=1)).max())
                row[f"{name}/forward_miss"] = not bool(sol.stats.converged.all())
                row[f"{name}/not_fixed_point"] = rel > layer.adjoint.fixed_point_tol
            seen.append(row)
    return seen


@pytest.fixture(autouse=True)
def _record_inputs(monkeypatch: pytest.MonkeyPatch) -> None:
    forward = DEQ.forward

    def keep(self: DEQ, x: Tensor) -> Tensor:
        self.last_input = x.detach()
        return forward(self, x)

    monkeypatch.setattr(DEQ, "forward", keep)


def test_two_implicit_layers_get_separate_counts_and_the_total_is_their_sum() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(DEQ(8, 4.0), nn.Linear(8, 8), DEQ(8, 0.1, max_steps=60))
    with ih.diagnostics.attribute_events(model) as labels:
        assert set(labels.labels) == {"0", "2"}
        seen = _train(model, 6)
    counts = ih.diagnostics.events().counts()
    misses = sum(r["0/forward_miss"] for r in seen)
    not_fixed = sum(r["0/not_fixed_point"] for r in seen)
    assert misses == 6 and not_fixed == 6  # the bad layer fails every step
    assert not any(r["2/forward_miss"] or r["2/not_fixed_point"] for r in seen)
    assert counts["0"]["NotFixedPointWarning"] == not_fixed  # raised in loss.backward()
    assert counts["0"]["ConvergenceWarning"] >= misses  # forward misses (+ backward GMRES)
    assert "2" not in counts  # the good layer: nothing, and nothing of layer 0 leaks to it
    total = ih.diagnostics.events().summary()["total"]
    assert total == sum(sum(kinds.values()) for kinds in counts.values())
    assert _SOURCE.get() is None  # no scope leaks out of the forward or the backward


def test_both_bad_layers_are_counted_apart_under_user_labels() -> None:
    torch.manual_seed(0)
    first, second = DEQ(8, 4.0), DEQ(8, 4.0, max_steps=2)
    model = nn.Sequential(first, second)
    with ih.diagnostics.label_events(first, "encoder"), ih.diagnostics.label_events(
        second, "decoder"
    ):
        _train(model, 4)
    counts = ih.diagnostics.events().counts()
    assert counts["encoder"]["NotFixedPointWarning"] == 4
    assert counts["decoder"]["NotFixedPointWarning"] == 4
    assert set(counts) == {"encoder", "decoder"}


def test_without_labels_or_after_remove_events_go_to_the_reporting_site() -> None:
    torch.manual_seed(0)
    layer = DEQ(8, 4.0)
    handle = ih.diagnostics.label_events(layer, "deq")
    handle.remove()
    _train(layer, 2)
    counts = ih.diagnostics.events().counts()
    assert "deq" not in counts
    assert counts["implicit backward"]["NotFixedPointWarning"] == 2
    assert counts["fixed_point"]["ConvergenceWarning"] == 2


def test_an_outer_label_does_not_take_an_inner_layers_events() -> None:
    torch.manual_seed(0)
    inner = DEQ(8, 4.0)
    model = nn.Sequential(nn.Linear(8, 8), inner)
    with ih.diagnostics.label_events(model, "model"), ih.diagnostics.label_events(inner, "deq"):
        _train(model, 2)
    assert set(ih.diagnostics.events().counts()) == {"deq"}


def test_bad_labels_are_refused() -> None:
    with pytest.raises(ValueError, match="label must be a non-empty str"):
        ih.diagnostics.label_events(nn.Linear(2, 2), "")
    with pytest.raises(TypeError, match=r"must be an nn\.Module"):
        ih.diagnostics.label_events(lambda x: x, "f")  # type: ignore[arg-type]
