"""``apply_norm`` / ``remove_norm``: torch's parametrisations on a DEQ map's layers, computed
once per solve inside ``ih.fixed_point``."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn
from torch.nn.utils import parametrize

import implicit_ham as ih


class Cell(nn.Module):
    """z -> tanh(W z + U x), the DEQ map of the tests."""

    def __init__(self, width: int = 6) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.W = nn.Linear(width, width, bias=False)
        self.U = nn.Linear(width, width)

    def forward(self, z: Tensor, x: Tensor) -> Tensor:
        return torch.tanh(self.W(z) + self.U(x))


def test_spectral_norm_bounds_the_weight_and_filters_by_name() -> None:
    cell = Cell()
    assert ih.nn.apply_norm(cell, "spectral", include=["W"]) == ["W"]
    assert parametrize.is_parametrized(cell.W, "weight")
    assert not parametrize.is_parametrized(cell.U, "weight")
    for _ in range(30):  # power iterations converge in training mode
        cell.W.weight  # noqa: B018
    assert float(torch.linalg.matrix_norm(cell.W.weight.detach(), ord=2)) == pytest.approx(
        1.0, rel=1e-3
    )
    with pytest.raises(ValueError, match="no unnormalised"):
        ih.nn.apply_norm(cell, "spectral", include=["W"])  # already normalised


def test_weight_norm_and_remove_norm_keep_the_value() -> None:
    cell = Cell()
    before = cell.W.weight.detach().clone()
    assert sorted(ih.nn.apply_norm(cell, "weight", exclude=["U"])) == ["W"]
    torch.testing.assert_close(cell.W.weight.detach(), before)  # w = g v / ||v|| starts at w
    assert ih.nn.remove_norm(cell) == ["W"]
    assert not parametrize.is_parametrized(cell.W)
    assert isinstance(cell.W.weight, nn.Parameter)
    torch.testing.assert_close(cell.W.weight.detach(), before)


def test_unknown_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown kind 'batch'"):
        ih.nn.apply_norm(Cell(), "batch")


@pytest.mark.parametrize("kind", ["weight", "spectral"])
@pytest.mark.parametrize("adjoint", [ih.Unroll(), ih.OneStep(), ih.Implicit()])
def test_the_parametrisation_runs_once_per_solve(kind: str, adjoint: ih.plugins.Adjoint) -> None:
    cell = Cell()
    ih.nn.apply_norm(cell, kind, include=["W"])
    calls = []
    norm = cell.W.parametrizations.weight[0]
    inner = norm.forward
    norm.forward = lambda *a: (calls.append(1), inner(*a))[1]  # type: ignore[method-assign]
    x = torch.randn(4, 6)
    sol = ih.fixed_point(
        cell, torch.zeros(4, 6), x, solver=ih.FixedPointIteration(max_steps=20), adjoint=adjoint
    )
    assert len(calls) == 1  # not 20: one evaluation of the normalised weight per solve
    sol.value.sum().backward()
    assert all(p.grad is not None for p in cell.W.parameters())
    calls.clear()
    for _ in range(3):
        cell(torch.zeros(4, 6), x)
    assert len(calls) == 3  # outside a solve every call recomputes it


@pytest.mark.parametrize("kind", ["weight", "spectral"])
@pytest.mark.parametrize("adjoint", [ih.Unroll(), ih.OneStep(), ih.Implicit()])
def test_the_cached_weight_gives_the_gradient_of_the_uncached_solve(
    kind: str, adjoint: ih.plugins.Adjoint
) -> None:
    """The reference: the same solve through a closure (no cache: the weight is recomputed at
    every evaluation by plain autograd). Eval mode, so spectral norm's power iteration does not
    move between the two solves."""
    torch.manual_seed(3)
    cell = Cell().double()
    ih.nn.apply_norm(cell, kind)
    cell.eval()
    x = torch.randn(4, 6, dtype=torch.float64)
    solver = ih.FixedPointIteration(max_steps=60)
    grads = []
    for f in (cell, lambda z, x: cell(z, x)):
        cell.zero_grad()
        sol = ih.fixed_point(f, torch.zeros(4, 6, dtype=torch.float64), x, solver=solver,
                             adjoint=adjoint)
        sol.value.square().sum().backward()
        grads.append([p.grad.clone() for p in cell.parameters()])
    for cached, plain in zip(*grads, strict=True):
        torch.testing.assert_close(cached, plain, rtol=1e-10, atol=1e-12)
