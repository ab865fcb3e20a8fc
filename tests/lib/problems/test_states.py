"""``fixed_point(..., states=)`` and ``fixed_point_correction``: the value is unchanged, each
state is the solver's iterate with the mode's gradient at that state (closed forms of the
one-step and phantom gradients of ``tanh(z W^T + x)``), and the correction's weights are
TorchDEQ's."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

import implicit_ham as ih

F64 = torch.float64


def problem(seed: int = 0) -> tuple[Tensor, Tensor, Tensor]:
    gen = torch.Generator().manual_seed(seed)
    W = 0.5 * torch.randn(4, 4, dtype=F64, generator=gen) / 2
    x = torch.randn(3, 4, dtype=F64, generator=gen)
    c = torch.randn(3, 4, dtype=F64, generator=gen)  # the loss is sum(c * state)
    return W, x, c


def f(z: Tensor, x: Tensor, W: Tensor) -> Tensor:
    return torch.tanh(z @ W.T + x)


def iterates(W: Tensor, x: Tensor, n: int) -> list[Tensor]:
    """z_1 .. z_n of plain iteration from 0, by hand."""
    z, out = torch.zeros_like(x), []
    for _ in range(n):
        z = torch.tanh(z @ W.T + x)
        out.append(z)
    return out


@pytest.mark.parametrize(
    "solver", [ih.FixedPointIteration(max_steps=12), ih.Anderson(max_steps=12, tol=None)]
)
@pytest.mark.parametrize("adjoint", [ih.OneStep(), ih.Implicit(), ih.Phantom(3, 0.5), ih.Unroll()])
def test_the_value_is_bitwise_the_same_with_and_without_states(solver, adjoint) -> None:
    if isinstance(adjoint, ih.Unroll) and isinstance(solver, ih.Anderson):
        pytest.skip("Unroll needs plain iteration")
    W, x, _ = problem()
    x = x.requires_grad_(True)
    plain = ih.fixed_point(f, torch.zeros_like(x), x, W, solver=solver, adjoint=adjoint)
    kept = ih.fixed_point(f, torch.zeros_like(x), x, W, solver=solver, adjoint=adjoint, states=3)
    assert torch.equal(plain.value, kept.value)
    assert len(kept.states) == 3 and plain.states == []


def test_each_state_is_the_iterate_with_the_one_step_gradient_at_it() -> None:
    W, x, c = problem()
    x = x.requires_grad_(True)
    sol = ih.fixed_point(
        f, torch.zeros_like(x), x, W, solver=ih.FixedPointIteration(max_steps=12),
        adjoint=ih.Implicit(), states=[2, 5, 12],
    )
    by_hand = iterates(W, x.detach(), 12)
    for index, state in zip([2, 5, 12], sol.states, strict=True):
        z_i = by_hand[index - 1]
        assert torch.equal(state.detach(), z_i)
        (grad,) = torch.autograd.grad((c * state).sum(), x)
        # one step from z_i: d/dx sum(c * tanh(z_i W^T + x)) = c * (1 - tanh^2)
        expected = c * (1 - torch.tanh(z_i @ W.T + x.detach()) ** 2)
        torch.testing.assert_close(grad, expected, rtol=1e-12, atol=1e-14)


def test_phantom_states_carry_the_damped_steps_gradient() -> None:
    W, x, c = problem(1)
    x = x.requires_grad_(True)
    k, tau = 3, 0.5
    sol = ih.fixed_point(
        f, torch.zeros_like(x), x, W, solver=ih.FixedPointIteration(max_steps=10),
        adjoint=ih.Phantom(k, tau), states=[4],
    )
    z4 = iterates(W, x.detach(), 4)[3]
    xr = x.detach().clone().requires_grad_(True)
    p = z4
    for _ in range(k):  # the reference: damped steps written out
        p = tau * torch.tanh(p @ W.T + xr) + (1 - tau) * p
    (expected,) = torch.autograd.grad((c * p).sum(), xr)
    (grad,) = torch.autograd.grad((c * sol.states[0]).sum(), x)
    torch.testing.assert_close(grad, expected, rtol=1e-12, atol=1e-14)
    assert torch.equal(sol.states[0].detach(), z4)


def test_n_states_are_spread_like_torchdeq_and_indices_past_the_stop_give_the_solution() -> None:
    W, x, _ = problem()
    sol = ih.fixed_point(f, torch.zeros_like(x), x, W,
                         solver=ih.FixedPointIteration(max_steps=10), states=3)
    by_hand = iterates(W, x, 10)
    for index, state in zip([4, 7, 10], sol.states, strict=True):  # TorchDEQ: 10 - (3-k-1)*3
        assert torch.equal(state, by_hand[index - 1])
    early = ih.fixed_point(f, torch.zeros_like(x), x, W,
                           solver=ih.FixedPointIteration(max_steps=200, tol=1e-3), states=[150])
    assert early.stats.steps < 150
    assert torch.equal(early.states[0], early.value)


@pytest.mark.parametrize("states", [0, 13, [0, 3], [5, 20], []])
def test_states_outside_the_budget_are_refused(states) -> None:
    W, x, _ = problem()
    with pytest.raises(ValueError, match=r"max_steps=12"):
        ih.fixed_point(f, torch.zeros_like(x), x, W,
                       solver=ih.FixedPointIteration(max_steps=12), states=states)


@pytest.mark.parametrize("weights", ["exp", "linear", "const"])
def test_the_correction_matches_torchdeq(weights: str) -> None:
    loss_mod = pytest.importorskip("torchdeq.loss")
    states = [torch.tensor(float(v), dtype=F64) for v in (3.0, 1.0, 0.5, 0.25)]
    ours = ih.fixed_point_correction(lambda s: s**2, states, weights)
    if weights == "const":  # torchdeq's const weight calls .cuda(): its formula by hand
        theirs = sum(s**2 for s in states)
    else:
        theirs = loss_mod.fp_correction(lambda s: s**2, (states,), weight_func=weights)
    assert float(ours) == pytest.approx(float(theirs), rel=1e-14)
    with pytest.raises(ValueError, match="unknown weights"):
        ih.fixed_point_correction(lambda s: s, states, "cubic")
    with pytest.raises(ValueError, match="at least one state"):
        ih.fixed_point_correction(lambda s: s, [], "exp")
