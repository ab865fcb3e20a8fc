"""``minimize`` over a batch of independent problems (per-sample line searches and stopping)
and in float32 at the defaults, against float64 closed forms."""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch

import implicit_ham as ih

F64 = torch.float64
SOLVERS = [ih.LBFGS(), ih.NewtonCG()]


def ridge_data(dtype: torch.dtype, n: int = 1024, d: int = 10) -> tuple[torch.Tensor, ...]:
    """TorchOpt's test_rr_solve_cg problem: X (n, d), y (n,), w0 (1, d), l2reg ()."""
    g = torch.Generator().manual_seed(42)
    w0 = torch.randn(1, d, generator=g)
    l2reg = torch.rand((), generator=g)
    X, y = torch.randn(n, d, generator=g), torch.randn(n, generator=g)
    return tuple(t.to(dtype) for t in (X, y, w0, l2reg))


def ridge_loss(w: torch.Tensor, l2reg: torch.Tensor, X: torch.Tensor, y: torch.Tensor):
    r = X @ w[0] - y
    return 0.5 * (r * r).mean() + 0.5 * l2reg * (w * w).sum()


def ridge_reference(X, y, l2reg, Xq, yq) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 closed form: w* = (X^T X / n + λ I)^{-1} X^T y / n and d mse(Xq w*, yq) / dλ
    = -grad_w^T A^{-1} w* (A the Hessian)."""
    X, y, Xq, yq = (t.to(F64) for t in (X, y, Xq, yq))
    n, d = X.shape
    A = X.T @ X / n + float(l2reg) * torch.eye(d, dtype=F64)
    w = torch.linalg.solve(A, X.T @ y / n)
    grad_w = 2 * Xq.T @ (Xq @ w - yq) / len(yq)
    return w, -(grad_w @ torch.linalg.solve(A, w))


@pytest.mark.parametrize("dtype", [torch.float32, F64], ids=str)
@pytest.mark.parametrize("solver", SOLVERS, ids=lambda s: s.name)
def test_ridge_converges_at_the_defaults_with_the_closed_form_hypergradient(
    dtype: torch.dtype, solver: ih.plugins.Minimizer
) -> None:
    X, y, w0, l2reg = ridge_data(dtype)
    Xq, yq = X.flip(0), y.flip(0)
    lam = l2reg.clone().requires_grad_()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no ConvergenceWarning, no NotFixedPointWarning
        sol = ih.minimize(ridge_loss, w0, lam, X, y, solver=solver)
        (hyper,) = torch.autograd.grad(((Xq @ sol.value[0] - yq) ** 2).mean(), lam)
    w_ref, hyper_ref = ridge_reference(X, y, l2reg, Xq, yq)
    assert bool(sol.stats.converged.all())
    assert sol.stats.steps < solver.max_steps
    tol = 1e-4 if dtype == torch.float32 else 1e-9
    assert torch.allclose(sol.value[0].to(F64), w_ref, atol=tol)
    assert abs(float(hyper) - float(hyper_ref)) < tol


def logistic_data(dtype: torch.dtype, n: int = 64, d: int = 5, classes: int = 3):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(n, d, generator=g).to(dtype)
    labels = torch.randint(0, classes, (n,), generator=g)
    phi = (0.5 * torch.randn(1, d * classes, generator=g)).to(dtype)
    return x, labels, phi


def logistic_loss(w, phi, x, labels, lam: float = 0.1):
    """iMAML-style proximal softmax regression: CE(x W, labels) + lam/2 ||w - phi||²."""
    logits = x @ w.reshape(x.shape[1], -1)
    ce = torch.nn.functional.cross_entropy(logits, labels)
    return ce + 0.5 * lam * ((w - phi) ** 2).sum()


def logistic_reference(x, labels, phi, lam: float = 0.1):
    """float64: w* by Newton with the explicit Hessian (X^T (diag p - p p^T) X / n + lam I per
    class block) and d sum(w*) / d phi = lam H^{-1} 1 (H symmetric)."""
    x, phi = x.to(F64), phi.to(F64)
    n, d = x.shape
    k = phi.numel() // d
    onehot = torch.nn.functional.one_hot(labels, k).to(F64)
    w = phi[0].clone()
    for _ in range(50):
        p = torch.softmax(x @ w.reshape(d, k), dim=1)
        grad = (x.T @ (p - onehot) / n).reshape(-1) + lam * (w - phi[0])
        H = torch.zeros(d * k, d * k, dtype=F64)
        for i in range(n):
            S = torch.diag(p[i]) - torch.outer(p[i], p[i])
            H += torch.kron(torch.outer(x[i], x[i]), S) / n
        H += lam * torch.eye(d * k, dtype=F64)
        w = w - torch.linalg.solve(H, grad)
    return w, lam * torch.linalg.solve(H, torch.ones(d * k, dtype=F64))


@pytest.mark.parametrize("dtype", [torch.float32, F64], ids=str)
@pytest.mark.parametrize("solver", SOLVERS, ids=lambda s: s.name)
def test_proximal_logistic_regression_at_the_defaults_matches_newton_in_float64(
    dtype: torch.dtype, solver: ih.plugins.Minimizer
) -> None:
    x, labels, phi = logistic_data(dtype)
    phi_req = phi.clone().requires_grad_()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sol = ih.minimize(logistic_loss, phi.clone(), phi_req, x, labels, solver=solver)
        (hyper,) = torch.autograd.grad(sol.value.sum(), phi_req)
    w_ref, hyper_ref = logistic_reference(x, labels, phi)
    tol = 1e-4 if dtype == torch.float32 else 1e-9
    assert torch.allclose(sol.value[0].to(F64), w_ref, atol=tol)
    assert torch.allclose(hyper[0].to(F64), hyper_ref, atol=tol)


def batched_ridge(B: int = 6, n: int = 40, d: int = 4):
    """B independent ridge problems with very different scales (each sample's curvature)."""
    g = torch.Generator().manual_seed(5)
    scales = torch.logspace(-1, 2, B, dtype=F64)
    X = torch.randn(B, n, d, generator=g, dtype=F64) * scales[:, None, None]
    y = torch.randn(B, n, generator=g, dtype=F64)
    return X, y


def per_sample_ridge(w, lam, X, y):
    """(B,): sample b's ½||X_b w_b - y_b||² / n + lam/2 ||w_b||²."""
    r = torch.einsum("bnd,bd->bn", X, w) - y
    return 0.5 * (r * r).mean(1) + 0.5 * lam * (w * w).sum(1)


@pytest.mark.parametrize("solver", SOLVERS, ids=lambda s: s.name)
@pytest.mark.parametrize("vector_loss", [True, False], ids=["per-sample", "summed"])
def test_a_batch_of_independent_problems_matches_each_closed_form(
    solver: ih.plugins.Minimizer, vector_loss: bool
) -> None:
    X, y = batched_ridge()
    B, n, d = X.shape
    lam = torch.tensor(0.3, dtype=F64, requires_grad=True)

    def loss(w, lam):
        values = per_sample_ridge(w, lam, X, y)
        return values if vector_loss else values.sum()

    sol = ih.minimize(loss, torch.zeros(B, d, dtype=F64), lam, solver=solver)
    (hyper,) = torch.autograd.grad(sol.value.pow(2).sum(), lam)
    A = X.transpose(1, 2) @ X / n + 0.3 * torch.eye(d, dtype=F64)
    w_ref = torch.linalg.solve(A, (X.transpose(1, 2) @ y[..., None] / n))[..., 0]
    hyper_ref = -(2 * w_ref * torch.linalg.solve(A, w_ref[..., None])[..., 0]).sum()
    assert bool(sol.stats.converged.all())
    assert torch.allclose(sol.value, w_ref, atol=1e-9)
    assert torch.allclose(hyper, hyper_ref, atol=1e-9)
    # one coupled problem (condition number ~1e6 across the samples' scales): same minimum;
    # L-BFGS needs many more steps than with per-sample searches (Newton-CG's exact Newton
    # steps on a quadratic do not care)
    long = dataclasses.replace(solver, max_steps=2000, tol=1e-6)
    coupled = ih.minimize(
        loss, torch.zeros(B, d, dtype=F64), lam, solver=long, batch_coupled=True
    )
    assert torch.allclose(coupled.value, w_ref, atol=1e-6)
    if isinstance(solver, ih.LBFGS):
        assert coupled.stats.steps > 2 * sol.stats.steps


def test_independent_rows_stop_on_their_own_and_do_not_slow_each_other() -> None:
    """A sample that starts at its minimum takes no step; with per-sample line searches the
    batch needs no more iterations than its hardest sample alone."""
    X, y = batched_ridge()
    B, n, d = X.shape
    lam = torch.tensor(0.3, dtype=F64)
    A = X.transpose(1, 2) @ X / n + 0.3 * torch.eye(d, dtype=F64)
    w_ref = torch.linalg.solve(A, (X.transpose(1, 2) @ y[..., None] / n))[..., 0]
    z0 = torch.zeros(B, d, dtype=F64)
    z0[0] = w_ref[0]
    sol = ih.minimize(per_sample_ridge, z0, lam, X, y)
    assert torch.equal(sol.value[0], w_ref[0])  # never moved
    alone = [
        ih.minimize(per_sample_ridge, z0[b : b + 1], lam, X[b : b + 1], y[b : b + 1]).stats.steps
        for b in range(B)
    ]
    assert sol.stats.steps == max(alone)
    trace = sol.stats.residuals  # (steps, B): sample 0's residual stays at its start
    assert float(trace[:, 0].max()) <= 1e-12


class _WrongGradient(torch.autograd.Function):
    """||z||² whose backward returns the negated gradient (a user's sign bug): every search
    direction goes uphill."""

    @staticmethod
    def forward(z: torch.Tensor) -> torch.Tensor:
        return (z * z).sum()

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        ctx.save_for_backward(inputs[0])

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        (z,) = ctx.saved_tensors
        return -2 * z * grad


def test_a_line_search_that_cannot_decrease_stops_with_a_stalled_status() -> None:
    """No step along the (wrong) direction decreases the loss: the search stalls at once
    instead of spending max_steps, and the warning says so."""
    with pytest.warns(ih.ConvergenceWarning, match="line search stalled for samples"):
        sol = ih.minimize(
            _WrongGradient.apply, torch.full((1, 3), 0.7, dtype=F64),
            solver=ih.LBFGS(max_steps=200), adjoint=ih.Implicit(fixed_point_tol=None),
        )
    assert sol.stats.steps == 1
    assert torch.equal(sol.value, torch.full((1, 3), 0.7, dtype=F64))


def test_a_loss_with_the_wrong_shape_is_refused() -> None:
    with pytest.raises(ValueError, match=r"scalar Tensor or the \(3,\) losses"):
        ih.minimize(lambda z: z * z, torch.ones(3, 2))
