"""``minimize`` over B independent problems (``batch_coupled=False``, the default): the forward
stops each sample on its own (``GradientDescent``), and the default implicit backward solves each
sample's Hessian block by CG stopped on its own residual (``PerSampleCG``). References: each
sample solved alone, and the dense float64 closed form of ridge regression."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

import implicit_ham as ih
from implicit_ham.adjoints import PerSampleCG
from implicit_ham.errors import NotPositiveDefiniteError
from implicit_ham.linalg.krylov import CG
from implicit_ham.linalg.operator import AdjointOperator

F64 = torch.float64


def _ridge_data(batch: int = 4, n: int = 32, d: int = 5) -> tuple[Tensor, Tensor, Tensor]:
    gen = torch.Generator().manual_seed(0)
    scales = torch.linspace(0.3, 3.0, batch, dtype=F64)[:, None, None]  # different curvatures
    x = torch.randn(batch, n, d, generator=gen, dtype=F64) * scales
    y = torch.randn(batch, n, generator=gen, dtype=F64)
    lam = torch.linspace(0.05, 0.5, batch, dtype=F64)
    return x, y, lam


def _ridge_loss(w: Tensor, lam: Tensor, x: Tensor, y: Tensor) -> Tensor:
    """(B,): ½ mean((X_b w_b - y_b)²) + ½ λ_b ||w_b||² per sample."""
    r = torch.einsum("bnd,bd->bn", x, w) - y
    return 0.5 * r.square().mean(1) + 0.5 * lam * w.square().sum(1)


def _closed_form(lam: Tensor, x: Tensor, y: Tensor) -> Tensor:
    """(B, d): w*_b = (X_bᵀX_b / n + λ_b I)⁻¹ X_bᵀ y_b / n, dense, float64."""
    n, d = x.shape[1], x.shape[2]
    h = x.transpose(1, 2) @ x / n + lam[:, None, None] * torch.eye(d, dtype=F64)
    return torch.linalg.solve(h, (x.transpose(1, 2) @ y[..., None] / n)[..., 0])


@pytest.mark.parametrize(
    ("adjoint", "name"),
    [(None, "auto:PerSampleDense"), (ih.Implicit(linear_solver=PerSampleCG(4)), "PerSampleCG")],
)
def test_default_and_per_sample_cg_backward_match_the_closed_form(
    adjoint: ih.Implicit | None, name: str
) -> None:
    """The default (``Auto``: 5 unknowns per sample, dense blocks) and ``PerSampleCG``."""
    x, y, lam = _ridge_data()
    gen = torch.Generator().manual_seed(1)
    target = torch.randn(x.shape[0], x.shape[2], dtype=F64, generator=gen)
    lam_a, x_a = lam.clone().requires_grad_(), x.clone().requires_grad_()
    tight = ih.LBFGS(tol=1e-12)  # the forward's error well below the gradients' tolerance
    sol = ih.minimize(
        _ridge_loss, torch.zeros(4, 5, dtype=F64), lam_a, x_a, y, solver=tight, adjoint=adjoint
    )
    outer = (sol.value - target).square().sum()
    grads = torch.autograd.grad(outer, (lam_a, x_a))
    (stats,) = sol.backward_log
    assert stats.linear_solver == name and stats.converged
    lam_r, x_r = lam.clone().requires_grad_(), x.clone().requires_grad_()
    ref = _closed_form(lam_r, x_r, y)
    ref_grads = torch.autograd.grad((ref - target).square().sum(), (lam_r, x_r))
    torch.testing.assert_close(sol.value, ref.detach(), rtol=0, atol=1e-10)
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-9)


def test_one_sample_and_coupled_batches_solve_the_whole_system() -> None:
    """No per-sample blocks: the whole Hessian, dense at this size (``Auto``)."""
    x, y, lam = _ridge_data()
    lam_a = lam.clone().requires_grad_()
    sol = ih.minimize(_ridge_loss, torch.zeros(4, 5, dtype=F64), lam_a, x, y, batch_coupled=True)
    sol.value.sum().backward()
    assert sol.backward_log[0].linear_solver == "auto:dense"
    one = ih.minimize(_ridge_loss, torch.zeros(1, 5, dtype=F64), lam_a[:1], x[:1], y[:1])
    one.value.sum().backward()
    assert one.backward_log[0].linear_solver == "auto:dense"


class _BlockOperator:
    """The block-diagonal system diag(A_1, ..., A_B) on flat (B n,) vectors, counting for
    each block the products in which its part of the vector was nonzero."""

    def __init__(self, blocks: Tensor) -> None:
        self.blocks = blocks
        self.moved = torch.zeros(blocks.shape[0], dtype=torch.int64)

    def __call__(self, flat: Tensor) -> Tensor:
        rows = flat.reshape(self.blocks.shape[0], -1)
        self.moved += rows.any(dim=1).to(torch.int64)
        return (self.blocks @ rows[..., None])[..., 0].reshape(-1)

    def operator(self) -> AdjointOperator:
        size = self.blocks.shape[0] * self.blocks.shape[1]
        return AdjointOperator(
            vjp=lambda v: v - self(v), vjp_batched=lambda r: r, size=size, system=self,
            label="Hessian",
        )  # fmt: skip


def _spd_blocks(conds: list[float], n: int = 8) -> Tensor:
    gen = torch.Generator().manual_seed(2)
    blocks = []
    for cond in conds:
        q, _ = torch.linalg.qr(torch.randn(n, n, dtype=F64, generator=gen))
        spectrum = torch.logspace(0, float(torch.log10(torch.tensor(cond))), n, dtype=F64)
        blocks.append(q @ torch.diag(spectrum) @ q.T)
    return torch.stack(blocks)


def test_per_sample_cg_equals_cg_on_each_block_alone() -> None:
    blocks = _spd_blocks([1.5, 1e3, 10.0])
    v = torch.randn(3 * 8, dtype=F64, generator=torch.Generator().manual_seed(3))
    batched = _BlockOperator(blocks)
    g, steps, _ = PerSampleCG(3).solve(batched.operator(), v, 100, 1e-8)
    rows = v.reshape(3, 8)
    for b in range(3):
        alone = _BlockOperator(blocks[b : b + 1])
        g_b, steps_b, _ = CG().solve(alone.operator(), rows[b], 100, 1e-8)
        # the same iterates: the same number of products moved sample b, the same solution up
        # to the rounding of the dot products (a per-row vecdot here, torch.dot there)
        assert int(batched.moved[b]) == steps_b
        torch.testing.assert_close(g.reshape(3, 8)[b], g_b, rtol=1e-7, atol=1e-12)
        residual = blocks[b] @ g.reshape(3, 8)[b] - rows[b]
        assert float(residual.norm()) <= 1e-8 * float(rows[b].norm())
    assert steps == int(batched.moved.max())
    assert int(batched.moved.min()) < steps  # the well-conditioned sample stopped first


def test_per_sample_cg_zero_sample_and_bad_input() -> None:
    blocks = _spd_blocks([2.0, 2.0])
    v = torch.cat([torch.zeros(8, dtype=F64), torch.ones(8, dtype=F64)])
    op = _BlockOperator(blocks)
    g, _, _ = PerSampleCG(2).solve(op.operator(), v, 50, 1e-10)
    assert int(op.moved[0]) == 0 and not bool(g[:8].any())  # v_b = 0: g_b = 0, no product
    with pytest.raises(ValueError, match="not a multiple of batch=3"):
        PerSampleCG(3).solve(op.operator(), v, 50, 1e-10)
    for bad in (0, -1, True, 2.0):
        with pytest.raises(ValueError, match="batch must be an integer"):
            PerSampleCG(bad)  # type: ignore[arg-type]
    indefinite = blocks.clone()
    indefinite[1] = -indefinite[1]
    with pytest.raises(NotPositiveDefiniteError, match=r"samples \[1\]"):
        ones = torch.ones(16, dtype=F64)
        PerSampleCG(2).solve(_BlockOperator(indefinite).operator(), ones, 50, 1e-10)


def test_indefinite_hessian_of_one_sample_is_refused_by_the_default_backward() -> None:
    def loss(z: Tensor, c: Tensor) -> Tensor:  # sample 1 sits at a saddle of z0² - z1²
        return 0.5 * (c[:, 0] * z[:, 0] ** 2 + c[:, 1] * z[:, 1] ** 2)

    c = torch.tensor([[1.0, 2.0], [1.0, -1.0]], dtype=F64, requires_grad=True)
    sol = ih.minimize(loss, torch.zeros(2, 2, dtype=F64), c, solver=ih.LBFGS(max_steps=1))
    with pytest.raises(NotPositiveDefiniteError, match=r"samples \[1\]"):
        sol.value.sum().backward()


def test_gradient_descent_stops_each_sample_at_its_own_tolerance() -> None:
    """Each sample's steps and value equal solving it alone (frozen once within tol)."""
    curv = torch.tensor([[0.5, 1.0], [1.5, 1.9], [0.2, 0.3]], dtype=F64)
    center = torch.tensor([[1.0, -2.0], [0.5, 0.5], [-1.0, 3.0]], dtype=F64)

    def loss(z: Tensor, a: Tensor, m: Tensor) -> Tensor:
        return 0.5 * (a * (z - m) ** 2).sum(1)

    solver = ih.GradientDescent(lr=0.5, max_steps=400, tol=1e-9)
    z0 = torch.zeros(3, 2, dtype=F64)
    batch = ih.minimize(loss, z0, curv, center, solver=solver)
    steps = batch.stats.steps_per_sample()
    assert len(set(steps.tolist())) == 3  # the samples stopped at different steps
    for b in range(3):
        alone = ih.minimize(loss, z0[b : b + 1], curv[b : b + 1], center[b : b + 1], solver=solver)
        assert int(steps[b]) == alone.stats.steps
        assert torch.equal(batch.value[b], alone.value[0])
        # a by-hand float64 loop: z <- z - lr a (z - m), stopping after the first step whose
        # size lr ||grad|| is <= lr tol (the residual of a step is its change)
        z, k, size = z0[b].clone(), 0, float("inf")
        while size > 0.5 * 1e-9:
            change = 0.5 * curv[b] * (z - center[b])
            z, k, size = z - change, k + 1, float(change.norm())
        assert k == int(steps[b])
        torch.testing.assert_close(batch.value[b], z, rtol=0, atol=1e-15)
