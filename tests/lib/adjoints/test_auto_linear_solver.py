"""``Auto``, ``Implicit``'s default linear solver: dense for small systems (whole, or per-sample
blocks), the iterative solver above or when a dense answer misses tol; the row scaling of the
Krylov solves (issue 46, item 1)."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

import implicit_ham as ih
from implicit_ham.linalg.operator import AdjointOperator, row_scales, scaled

F64 = torch.float64


def _layer(batch: int, n: int, coupling: float, adjoint: ih.Implicit) -> tuple[Tensor, ih.Solution]:
    """tanh(W z + x + coupling * batch-mean(z)): independent samples for coupling = 0."""
    gen = torch.Generator().manual_seed(n)
    q, _ = torch.linalg.qr(torch.randn(n, n, generator=gen, dtype=F64))
    w = 0.6 * q
    x = torch.randn(batch, n, generator=gen, dtype=F64, requires_grad=True)
    v = torch.randn(batch, n, generator=gen, dtype=F64)

    def f(z: Tensor, x: Tensor) -> Tensor:
        return torch.tanh(z @ w.T + x + coupling * z.mean(0, keepdim=True))

    sol = ih.fixed_point(
        f, torch.zeros(batch, n, dtype=F64), x,
        solver=ih.Anderson(max_steps=300, tol=1e-13), adjoint=adjoint,
    )
    (grad,) = torch.autograd.grad((sol.value * v).sum(), x)
    return grad, sol


@pytest.mark.parametrize(
    ("batch", "n", "coupling", "chosen"),
    [
        (1, 16, 0.0, "auto:dense"),  # one system, M <= 128
        (64, 8, 0.0, "auto:PerSampleDense"),  # independent samples, N <= 32
        (4, 8, 0.3, "auto:dense"),  # coupled samples: the blocks miss tol, M = 32 <= 128
        (64, 8, 0.3, "auto:gmres"),  # coupled samples, M = 512: the blocks miss tol, GMRES
        (2, 80, 0.0, "auto:gmres"),  # N = 80 > 32, M = 160 > 128
    ],
)
def test_auto_picks_by_size_and_falls_back_on_a_missed_tol(
    batch: int, n: int, coupling: float, chosen: str
) -> None:
    got, sol = _layer(batch, n, coupling, ih.Implicit(tol=1e-10))
    reference, _ = _layer(batch, n, coupling, ih.Implicit("dense", tol=1e-10))
    stats = sol.backward_stats
    assert stats.linear_solver == chosen and stats.converged
    dense = chosen in ("auto:dense", "auto:PerSampleDense")
    tol = 1e-8 if dense else 1e-6  # GMRES: tol=1e-10 on the residual
    torch.testing.assert_close(got, reference, rtol=tol, atol=1e-2 * tol)
    assert (stats.cond is not None) == dense  # κ exact from a dense solve, else unknown


def test_a_singular_small_system_goes_on_to_gmres() -> None:
    """A consistent singular system (a direction f ignores: J = I there): the dense solve
    cannot factorise it; GMRES solves the consistent right-hand side; κ stays as the dense
    solve measured it (huge), with its warning."""

    def f(z: Tensor, x: Tensor) -> Tensor:
        return torch.cat([0.5 * torch.tanh(z[:, :1] + x), z[:, 1:]], dim=1)

    x = torch.tensor([[0.3]], dtype=F64, requires_grad=True)
    z0 = torch.zeros(1, 2, dtype=F64)
    sol = ih.fixed_point(f, z0, x, solver=ih.FixedPointIteration(max_steps=200, tol=1e-14))
    sol = ih.fixed_point(
        f, sol.value.detach(), x, solver=ih.FixedPointIteration(max_steps=1), adjoint=ih.Implicit()
    )
    with pytest.warns(ih.ConditioningWarning, match=r"κ\(I - J\) = "):
        (grad,) = torch.autograd.grad(sol.value[:, 0].sum(), x)
    z = float(sol.value[0, 0])
    slope = 0.5 * (1 - torch.tanh(torch.tensor(z + 0.3)) ** 2)  # z = 0.5 tanh(z + x)
    assert float(grad) == pytest.approx(float(slope / (1 - slope)), rel=1e-8)
    assert sol.backward_stats.linear_solver == "auto:gmres"


def test_row_scales_leave_a_well_scaled_system_alone_and_equilibrate_an_ill_scaled_one() -> None:
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(6, 6, generator=gen, dtype=F64)
    a = a @ a.T + 6 * torch.eye(6, dtype=F64)

    def op_of(matrix: Tensor) -> AdjointOperator:
        return AdjointOperator(
            lambda x: x - matrix @ x, lambda r: r - r @ matrix.T, 6,
            system=lambda x: matrix @ x, system_batched=lambda r: r @ matrix.T,
        )

    scale, products = row_scales(op_of(a), F64, torch.device("cpu"))
    assert scale is None and products == 4
    d = torch.tensor([1e4, 1.0, 1e-3, 1.0, 1e2, 1.0], dtype=F64)
    ill = d[:, None] * a * d[None, :]
    scale, products = row_scales(op_of(ill), F64, torch.device("cpu"))
    assert scale is not None and products <= 12
    eye = torch.eye(6, dtype=F64)
    equilibrated = scaled(op_of(ill), scale).system_matrix(eye)
    # rows within SCALE_BAND = 100 of the median are left alone: κ drops by 1e9, not to κ(a)
    assert float(torch.linalg.cond(ill)) > 1e13
    assert float(torch.linalg.cond(equilibrated)) < 1e-9 * float(torch.linalg.cond(ill))


def _cd_gradient(adjoint: ih.Implicit) -> tuple[Tensor, ih.Solution]:
    gen = torch.Generator().manual_seed(0)
    x = 2 * torch.rand(2, 16, 4, 4, generator=gen, dtype=F64) - 1.0
    d0 = torch.rand(1, 16, 4, generator=gen, dtype=F64)
    d0 = (d0 / d0.norm(dim=1, keepdim=True)).expand(2, 16, 4).contiguous()
    weight = torch.randn(x.shape, generator=gen, dtype=F64)
    layer = ih.make_decomposition("cd", rank=4, groups=1, steps=60, adjoint=adjoint)
    xg = x.clone().requires_grad_()
    (grad,) = torch.autograd.grad((layer(xg, init=d0) * weight).sum(), xg)
    assert layer.last_solution is not None
    return grad, layer.last_solution


def test_a_decomposition_implicit_default_takes_scaled_gmres_and_matches_dense_blocks() -> None:
    """CD (64 bases + 16 x 4 codes = 128 unknowns per sample, above block_max): the default is
    GMRES, its 4 scaling probes find the system well scaled and leave it alone."""
    reference, _ = _cd_gradient(
        ih.Implicit(linear_solver=ih.linalg.PerSampleDense(2), tol=1e-12, cond_threshold=None)
    )
    got, sol = _cd_gradient(ih.Implicit(tol=1e-10))
    stats = sol.backward_stats
    assert stats.linear_solver == "auto:gmres" and stats.cond is None and stats.converged
    assert stats.steps >= ih.linalg.operator.SCALE_PROBES + 1
    torch.testing.assert_close(got, reference, rtol=1e-8, atol=1e-12)
