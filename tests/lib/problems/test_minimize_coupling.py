"""``minimize`` refuses a loss that couples the samples of a batch it solves as independent
problems (``solvers.coupling``): the probe against dense float64 references (the coupled
problem solved as one, the per-sample problems solved alone), and its stated blind spots."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

import implicit_ham as ih

F64 = torch.float64


def _problem() -> tuple[Tensor, Tensor]:
    gen = torch.Generator().manual_seed(0)
    return torch.randn(5, 3, generator=gen, dtype=F64), torch.randn(5, generator=gen, dtype=F64)


def test_a_vector_without_batch_dimension_is_refused_and_the_fix_is_exact() -> None:
    a, y = _problem()
    y = y.requires_grad_()
    with pytest.raises(ValueError, match=r"vector of shape \(3,\).*z0\[None\]"):
        ih.minimize(lambda z, y: 0.5 * (a @ z - y).square().sum(), torch.zeros(3, dtype=F64), y)
    # the fix the message names: one problem of shape (1, 3); d(sum z*)/dy = pinv(A)^T 1
    sol = ih.minimize(lambda z, y: 0.5 * (a @ z[0] - y).square().sum(),
                      torch.zeros(1, 3, dtype=F64), y)  # fmt: skip
    (grad,) = torch.autograd.grad(sol.value.sum(), y)
    expected = torch.linalg.pinv(a).T @ torch.ones(3, dtype=F64)
    torch.testing.assert_close(grad, expected, rtol=1e-7, atol=1e-9)


def test_a_batch_statistic_is_refused_and_batch_coupled_solves_it() -> None:
    gen = torch.Generator().manual_seed(1)
    target = torch.randn(6, generator=gen, dtype=F64)
    lam = 0.3

    def loss(z: Tensor) -> Tensor:  # (4, 6): the batch's sum must meet the target
        return 0.5 * (z.sum(0) - target).square().sum() + 0.5 * lam * z.square().sum()

    z0 = torch.zeros(4, 6, dtype=F64)
    with pytest.raises(ValueError, match="couples the samples") as caught:
        ih.minimize(loss, z0)
    assert "vector of shape" not in str(caught.value)  # the (n,) hint is for vectors only
    value = ih.minimize(loss, z0, batch_coupled=True).value
    # dense reference: (1 1^T kron I + lam I) vec(z) = 1 kron target
    hessian = torch.kron(torch.ones(4, 4, dtype=F64), torch.eye(6, dtype=F64))
    hessian += lam * torch.eye(24, dtype=F64)
    expected = torch.linalg.solve(hessian, target.repeat(4)).reshape(4, 6)
    torch.testing.assert_close(value, expected, rtol=1e-6, atol=1e-8)


def test_independent_samples_with_shared_weights_and_a_mean_pass_the_probe() -> None:
    gen = torch.Generator().manual_seed(2)
    shared = torch.randn(7, 3, generator=gen, dtype=F64)  # one matrix, every sample
    y = torch.randn(4, 7, generator=gen, dtype=F64)

    def loss(z: Tensor, y: Tensor) -> Tensor:  # the mean over the batch keeps it separable
        return 0.5 * (z @ shared.T - y).square().sum(1).mean() + 0.05 * z.square().sum()

    value = ih.minimize(loss, torch.zeros(4, 3, dtype=F64), y).value
    h = shared.T @ shared / 4 + 0.1 * torch.eye(3, dtype=F64)
    expected = torch.linalg.solve(h, (y @ shared / 4).T).T  # each sample alone
    torch.testing.assert_close(value, expected, rtol=1e-6, atol=1e-8)


class _OnceDifferentiableSquare(torch.autograd.Function):
    """x^2 with a first derivative only (no double backward)."""

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, x: Tensor) -> Tensor:
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    @once_differentiable
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: Tensor) -> Tensor:
        (x,) = ctx.saved_tensors  # type: ignore[attr-defined]
        return 2 * x * grad


def test_the_probe_steps_aside_for_a_loss_without_second_derivatives() -> None:
    # a per-sample loss whose backward is not differentiable: the forward solve still runs
    # (no Hessian is needed without gradient) and finds each sample's minimiser z = c
    c = torch.tensor([[1.0, -2.0], [0.5, 3.0], [-1.0, 0.0]], dtype=F64)
    with torch.no_grad():
        value = ih.minimize(lambda z: _OnceDifferentiableSquare.apply(z - c).sum(),
                            torch.zeros(3, 2, dtype=F64)).value  # fmt: skip
    torch.testing.assert_close(value, c, rtol=0, atol=1e-6)
