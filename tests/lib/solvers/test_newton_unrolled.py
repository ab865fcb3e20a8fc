"""Through-iteration gradients of ``Newton`` (``ih.root``): ``Unroll`` is the derivative of the
unrolled Newton iteration (central differences of the solve with the same number of steps),
``Truncated(k)`` that of its last k steps (a Newton solve of k steps from the iterate the others
reach), and the value never depends on the mode."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

import implicit_ham as ih

DT = torch.float64


def g(z: Tensor, a: Tensor) -> Tensor:
    return z**3 + 0.5 * z + 0.1 * torch.sin(z.flip(1)) - a


def inputs() -> tuple[Tensor, Tensor, Tensor]:
    gen = torch.Generator().manual_seed(0)
    a = (1 + torch.rand(3, 4, generator=gen, dtype=DT)).requires_grad_()
    w = torch.randn(3, 4, generator=gen, dtype=DT)
    d = torch.randn(3, 4, generator=gen, dtype=DT)
    return a, w, d


def central(fn, a: Tensor, d: Tensor, w: Tensor, eps: float = 1e-6) -> float:
    with torch.no_grad():
        return float(((fn(a + eps * d) - fn(a - eps * d)) * w).sum()) / (2 * eps)


@pytest.mark.parametrize("linear_solver", ["dense", "gmres"])
def test_unroll_is_the_derivative_of_the_unrolled_iteration(linear_solver: str) -> None:
    a, w, d = inputs()
    solver = ih.Newton(max_steps=4, tol=None, linear_solver=linear_solver, linear_tol=1e-13)
    z0 = torch.full((3, 4), 0.5, dtype=DT, requires_grad=True)
    sol = ih.root(g, z0, a, solver=solver, adjoint=ih.Unroll())
    assert torch.equal(sol.value, ih.root(g, z0, a, solver=solver).value)
    grad_a, grad_z0 = torch.autograd.grad((sol.value * w).sum(), (a, z0))
    fd_a = central(lambda aa: ih.root(g, z0, aa, solver=solver).value, a, d, w)
    fd_z0 = central(lambda zz: ih.root(g, zz, a, solver=solver).value, z0, d, w)
    assert abs(float((grad_a * d).sum()) - fd_a) <= 1e-6 * abs(fd_a)
    assert abs(float((grad_z0 * d).sum()) - fd_z0) <= 1e-6 * max(abs(fd_z0), 1e-4)


def test_truncated_is_the_derivative_of_the_last_steps() -> None:
    a, w, d = inputs()
    z0 = torch.full((3, 4), 0.5, dtype=DT)
    total, k = 4, 2
    sol = ih.root(g, z0, a, solver=ih.Newton(max_steps=total, tol=None, linear_solver="dense"),
                  adjoint=ih.Truncated(k))
    (grad,) = torch.autograd.grad((sol.value * w).sum(), a)
    with torch.no_grad():
        head = ih.root(g, z0, a, solver=ih.Newton(max_steps=total - k, tol=None,
                                                  linear_solver="dense")).value
    tail = ih.Newton(max_steps=k, tol=None, linear_solver="dense")
    fd = central(lambda aa: ih.root(g, head, aa, solver=tail).value, a, d, w)
    assert abs(float((grad * d).sum()) - fd) <= 1e-6 * abs(fd)
