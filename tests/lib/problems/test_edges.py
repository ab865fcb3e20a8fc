"""Edge inputs: an empty batch works everywhere; a dtype change inside f, an integer state and a
misspelt option are clear errors; a custom solver's value cannot depend on the backward mode."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

import implicit_ham as ih

DT = torch.float64
SOLVERS = [
    ih.FixedPointIteration(max_steps=5),
    ih.FixedPointIteration(max_steps=40, tol=1e-8),
    ih.Anderson(max_steps=10),
    ih.Broyden(max_steps=10),
]
MODES = [
    ih.OneStep(),
    ih.Truncated(2),
    ih.Phantom(2, 0.5),
    ih.Implicit(),
    ih.Implicit(linear_solver="dense"),
    ih.Neumann(),
]


@pytest.mark.parametrize("solver", SOLVERS, ids=lambda s: repr(s)[:40])
@pytest.mark.parametrize("adjoint", [ih.Unroll(), *MODES], ids=lambda a: a.name)
def test_an_empty_batch_gives_empty_values_and_zero_parameter_gradients(solver, adjoint) -> None:
    if isinstance(adjoint, ih.Unroll) and not isinstance(solver, ih.FixedPointIteration):
        pytest.skip("Unroll needs plain iteration")
    W = torch.randn(5, 5, dtype=DT, requires_grad=True)
    x = torch.randn(0, 5, dtype=DT, requires_grad=True)
    sol = ih.fixed_point(
        lambda z, x: torch.tanh(z @ W + x),
        torch.zeros(0, 5, dtype=DT),
        x,
        solver=solver,
        adjoint=adjoint,
    )
    assert sol.value.shape == (0, 5) and sol.value.dtype == DT
    grad_x, grad_w = torch.autograd.grad(sol.value.sum(), (x, W), allow_unused=True)
    assert grad_x.shape == (0, 5)
    torch.testing.assert_close(grad_w, torch.zeros_like(W), rtol=0, atol=0)
    assert sol.stats.steps == 0 and sol.stats.summary()["rel_residual"] == 0.0


@pytest.mark.parametrize("ham", [ih.NMF, ih.VQ, ih.CD, ih.SVD])
@pytest.mark.parametrize(
    "adjoint", [ih.OneStep(), ih.Unroll(), ih.Implicit()], ids=lambda a: a.name
)
def test_an_empty_batch_passes_through_every_ham_and_block(ham, adjoint) -> None:
    layer = ham(rank=2, adjoint=adjoint)
    x = torch.rand(0, 8, 4, 4, requires_grad=True)
    y = layer(x)
    y.sum().backward()
    assert y.shape == x.shape and x.grad.shape == x.shape
    block = ih.Hamburger(8, ham(rank=2, adjoint=adjoint)).eval()
    z = torch.rand(0, 8, 4, 4, requires_grad=True)
    block(z).sum().backward()
    assert z.grad.shape == z.shape


def test_f_changing_the_dtype_is_an_error_naming_both() -> None:
    x = torch.randn(2, 3, dtype=torch.float64)
    with pytest.raises(TypeError, match=r"dtype torch\.float64, but z0 has dtype torch\.float32"):
        ih.fixed_point(lambda z, x: z + x, torch.zeros(2, 3), x)


def test_an_integer_state_is_an_error() -> None:
    with pytest.raises(TypeError, match="floating dtype is needed"):
        ih.fixed_point(lambda z: z, torch.zeros(2, 3, dtype=torch.int64))


@pytest.mark.parametrize("cls", [ih.NMF, ih.VQ, ih.CD, ih.SVD, ih.NormalizedNMF])
def test_a_misspelt_decomposition_option_lists_the_valid_ones(cls) -> None:
    with pytest.raises(TypeError, match=r"unknown option\(s\) rnak for \w+; valid options: rank, "):
        cls(rnak=3)
    assert cls(rank=3).rank == 3


def test_cd_lists_its_own_option_too() -> None:
    with pytest.raises(TypeError, match=r"valid options: rank, beta, .*groups"):
        ih.CD(betta=0.2)


@dataclass(frozen=True)
class DelegatingSolver(ih.plugins.FixedPointSolver):
    """The shape of a user solver: it configures an inner damped iteration."""

    max_steps: int = 20
    tol: float | None = None

    def solve(self, f, z0, spec):
        inner = ih.FixedPointIteration(max_steps=self.max_steps, damping=0.7)
        return inner.solve(f, z0, spec)


def test_a_custom_solver_gives_one_value_under_every_backward_mode() -> None:
    W = torch.randn(6, 6, dtype=DT) * 0.2
    x = torch.randn(3, 6, dtype=DT)
    values = [
        ih.fixed_point(
            lambda z, x: torch.tanh(z @ W + x),
            torch.zeros(3, 6, dtype=DT),
            x,
            solver=DelegatingSolver(),
            adjoint=adjoint,
        ).value
        for adjoint in MODES
    ]
    z = torch.zeros(3, 6, dtype=DT)
    for _ in range(20):  # the damped iteration written out
        z = 0.7 * torch.tanh(z @ W + x) + (1 - 0.7) * z
    for value in values:
        assert torch.equal(value, z)
    # it only finds z*: Unroll, which needs the solver's own iterates, is refused
    with pytest.raises(ValueError, match="DelegatingSolver runs without gradient"):
        ih.fixed_point(lambda z, x: torch.tanh(z @ W + x), torch.zeros(3, 6, dtype=DT), x,
                       solver=DelegatingSolver(), adjoint=ih.Unroll())  # fmt: skip
