"""Per-sample Jacobians from products with the whole batch (``sample_jacobian``) against
``torch.func.jacrev`` of each sample alone, in both modes, with their graph; the coupling
probe; the batched normal-equation solve with its pseudo-inverse fallback."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from implicit_ham.solvers.least_squares import solve_normal
from implicit_ham.solvers.sample_jacobian import check_independent, residuals_and_jacobian

DT = torch.float64


def sample_fn(rows: int, n: int) -> tuple[torch.nn.Module, Tensor]:
    """A nonlinear per-sample map (P, n) -> (P, rows) and a point (P = 5)."""
    gen = torch.Generator().manual_seed(rows * 10 + n)
    weight = torch.randn(rows, n, generator=gen, dtype=DT, requires_grad=True)
    x = torch.randn(5, n, generator=gen, dtype=DT)

    class Fn(torch.nn.Module):
        def forward(self, y: Tensor) -> Tensor:
            return torch.tanh(y @ weight.T) * y.square().sum(1, keepdim=True)

    return Fn(), x


@pytest.mark.parametrize(("rows", "n"), [(7, 3), (2, 6)], ids=["forward", "reverse"])
def test_blocks_are_each_samples_jacobian(rows: int, n: int) -> None:
    fn, x = sample_fn(rows, n)
    r, jac = residuals_and_jacobian(fn, x, rows)
    assert r.shape == (5, rows) and jac.shape == (5, rows, n)
    for p in range(5):
        alone = torch.func.jacrev(lambda v: fn(v[None])[0])(x[p])
        assert torch.allclose(jac[p], alone, rtol=1e-12, atol=1e-12)
    with torch.no_grad():  # without grad mode: the same values, no graph
        _, plain = residuals_and_jacobian(fn, x, rows)
    assert torch.equal(plain, jac.detach()) and not plain.requires_grad


def test_under_grad_mode_the_jacobian_carries_its_graph() -> None:
    fn, x = sample_fn(7, 3)
    x = x.requires_grad_()
    with torch.enable_grad():
        _, jac = residuals_and_jacobian(fn, x, 7)
        (gx,) = torch.autograd.grad(jac.square().sum(), x)
    def dense(v: Tensor) -> Tensor:
        return torch.stack(
            [torch.func.jacrev(lambda u: fn(u[None])[0])(v[p]) for p in range(5)]
        ).square().sum()
    assert torch.allclose(gx, torch.func.grad(dense)(x.detach()), rtol=1e-10, atol=1e-12)


def test_the_probe_catches_a_batch_statistic_and_passes_independent_samples() -> None:
    fn, x = sample_fn(7, 3)
    check_independent(fn, x, "here")  # independent: no error
    with pytest.raises(ValueError, match="couple samples"):
        check_independent(lambda y: fn(y) + y.mean(0).sum(), x, "here")
    with pytest.raises(ValueError, match="couple samples"):  # only sample 0 leaks into others
        check_independent(lambda y: fn(y) + 1e-9 * y[:1, :1], x, "here")


def test_normal_equations_solve_and_fall_back_on_singular_samples() -> None:
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(4, 6, 3, generator=gen, dtype=DT)
    gram = a.transpose(1, 2) @ a
    gram[2] = torch.outer(a[2, 0], a[2, 0])  # rank one: Cholesky fails for sample 2
    rhs = torch.randn(4, 3, generator=gen, dtype=DT)
    got = solve_normal(gram, rhs)
    expected = torch.linalg.pinv(gram, hermitian=True) @ rhs[..., None]
    assert torch.allclose(got, expected[..., 0], rtol=1e-8, atol=1e-10)
    assert torch.isfinite(got).all()
