"""``jacobian_penalty`` against exact references: a linear map, whose ||J||_F^2 / numel is
||A||_F^2 / d, and a nonlinear map against a dense float64 Jacobian with the same probes."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor

import implicit_ham as ih

F64 = torch.float64


def test_linear_map_mean_equals_frobenius_norm_over_d_and_gradient_is_2a_over_d() -> None:
    gen = torch.Generator().manual_seed(0)
    batch, d = 3, 5
    A = torch.randn(d, d, dtype=F64, generator=gen).requires_grad_(True)
    x = torch.randn(batch, d, dtype=F64, generator=gen)
    z = torch.randn(batch, d, dtype=F64, generator=gen)

    def f(z: Tensor, x: Tensor) -> Tensor:
        return z @ A.T + x

    draws, grads = [], []
    for _ in range(2000):
        penalty = ih.jacobian_penalty(f, z, x, generator=gen)
        (grad,) = torch.autograd.grad(penalty, A)
        draws.append(float(penalty.detach()))
        grads.append(grad)
    values = torch.tensor(draws, dtype=F64)
    exact = float(A.detach().square().sum()) / d
    stderr = float(values.std()) / math.sqrt(len(draws))
    assert abs(float(values.mean()) - exact) < 4 * stderr
    mean_grad = torch.stack(grads).mean(0)
    grad_err = torch.stack(grads).std(0) / math.sqrt(len(grads))
    assert bool(((mean_grad - 2 * A.detach() / d).abs() <= 4 * grad_err + 1e-12).all())


def _probes(shapes: list[torch.Size], seed: int, samples: int) -> list[tuple[Tensor, ...]]:
    gen = torch.Generator().manual_seed(seed)
    return [tuple(torch.randn(s, dtype=F64, generator=gen) for s in shapes) for _ in range(samples)]


def test_nonlinear_tuple_state_matches_a_dense_jacobian_with_the_same_probes() -> None:
    gen = torch.Generator().manual_seed(1)
    W = (0.4 * torch.randn(4, 4, dtype=F64, generator=gen)).requires_grad_(True)
    x = torch.randn(2, 4, dtype=F64, generator=gen)
    z = (torch.randn(2, 4, dtype=F64, generator=gen), torch.randn(2, 3, dtype=F64, generator=gen))

    def f(z: tuple[Tensor, Tensor], x: Tensor) -> tuple[Tensor, Tensor]:
        a, b = z
        return torch.tanh(a @ W.T + x + b.sum(1, keepdim=True)), torch.sin(b) * a[:, :3]

    samples = 3
    got = ih.jacobian_penalty(f, z, x, samples=samples, generator=torch.Generator().manual_seed(7))

    def flat(vec: Tensor) -> Tensor:
        out = f((vec[:8].reshape(2, 4), vec[8:].reshape(2, 3)), x)
        return torch.cat([t.reshape(-1) for t in out])

    point = torch.cat([t.reshape(-1) for t in z])
    jac = torch.autograd.functional.jacobian(flat, point)  # (14, 14) dense
    expected = 0.0
    for probe in _probes([t.shape for t in z], 7, samples):
        v = torch.cat([p.reshape(-1) for p in probe])
        expected += float((v @ jac).square().sum())
    assert float(got) == pytest.approx(expected / (samples * 14), rel=1e-12)
    # and it trains: the penalty's gradient w.r.t. W is that of the same formula
    (grad,) = torch.autograd.grad(got, W)
    assert grad.abs().sum() > 0


def test_bad_input_is_refused_with_the_argument_named() -> None:
    z = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="samples must be an int >= 1"):
        ih.jacobian_penalty(torch.tanh, z, samples=0)
    with pytest.raises(ValueError, match="does not depend on z"):
        ih.jacobian_penalty(lambda z: torch.ones(2, 3), z)
    # a graph to f's parameters but none to z (z detached, or not used): refused, not a
    # penalty of 0 that trains nothing
    cell = torch.nn.Linear(3, 3)
    for f in (lambda z, x: cell(z.detach()) + x, lambda z, x: cell(x)):
        with pytest.raises(ValueError, match="does not depend on z"):
            ih.jacobian_penalty(f, z, torch.ones(2, 3))
    with torch.no_grad(), pytest.raises(RuntimeError, match="gradient enabled"):
        ih.jacobian_penalty(torch.tanh, z)
