"""``ih.minimize`` / ``ih.least_squares``: argmin layers in the peers' canonical cases (ridge and
logistic-regression hypergradients, a Gauss-Newton / LM curve fit, NNLS with active
constraints), each against an independent reference: a closed form, a dense active-set formula
or central finite differences of a tightly converged solve."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import Tensor

import implicit_ham as ih

DT = torch.float64
EXACT = ih.Implicit(linear_solver="cg", tol=1e-12, on_divergence="raise")


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# --- ridge regression: hypergradient w.r.t. the regularisation, closed form ----------------

X_TR = torch.randn(20, 5, generator=gen(0), dtype=DT)
Y_TR = torch.randn(20, generator=gen(1), dtype=DT)
X_VA = torch.randn(10, 5, generator=gen(2), dtype=DT)
Y_VA = torch.randn(10, generator=gen(3), dtype=DT)


def ridge_loss(w: Tensor, lam: Tensor, X: Tensor) -> Tensor:
    return 0.5 * (X @ w[0] - Y_TR).square().sum() + 0.5 * lam * w.square().sum()


def ridge_closed_form(lam: Tensor, X: Tensor) -> Tensor:
    return torch.linalg.solve(X.T @ X + lam * torch.eye(5, dtype=DT), X.T @ Y_TR)


def validation(w: Tensor) -> Tensor:
    return 0.5 * (X_VA @ w.reshape(-1) - Y_VA).square().sum()


def ridge_inputs() -> tuple[Tensor, Tensor]:
    return torch.tensor(0.7, dtype=DT, requires_grad=True), X_TR.clone().requires_grad_()


def gd_for_ridge(lam: float, steps: int = 2000) -> ih.GradientDescent:
    """lr = 1 / L with L the largest Hessian eigenvalue."""
    top = float(torch.linalg.eigvalsh(X_TR.T @ X_TR)[-1]) + lam
    return ih.GradientDescent(lr=1.0 / top, max_steps=steps, tol=1e-11)


@pytest.mark.parametrize(
    ("solver", "adjoint"),
    [
        (ih.LBFGS(tol=1e-11), EXACT),
        (ih.NewtonCG(tol=1e-11), EXACT),
        (ih.LBFGS(tol=1e-11), ih.Implicit(linear_solver="gmres", tol=1e-12)),
        (ih.LBFGS(tol=1e-11), ih.Implicit(linear_solver="dense")),
        ("gd", EXACT),
        ("gd", ih.Unroll()),
    ],
    ids=["lbfgs-cg", "newton_cg-cg", "lbfgs-gmres", "lbfgs-dense", "gd-cg", "gd-unroll"],
)
def test_ridge_hypergradient_matches_the_closed_form(solver, adjoint) -> None:
    lam, X = ridge_inputs()
    solver = gd_for_ridge(0.7) if solver == "gd" else solver
    sol = ih.minimize(
        ridge_loss, torch.zeros(1, 5, dtype=DT), lam, X, solver=solver, adjoint=adjoint
    )
    expected_w = ridge_closed_form(lam, X)
    assert torch.allclose(sol.value[0], expected_w.detach(), rtol=0, atol=1e-10)
    got = torch.autograd.grad(validation(sol.value), (lam, X))
    expected = torch.autograd.grad(validation(expected_w), (lam, X))
    for g, e in zip(got, expected, strict=True):
        assert torch.allclose(g, e, rtol=1e-8, atol=1e-10)


# --- logistic regression: hypergradient vs central differences -----------------------------

X_LOG = torch.randn(30, 4, generator=gen(4), dtype=DT)
Y_LOG = torch.where(torch.rand(30, generator=gen(5), dtype=DT) < 0.5, -1.0, 1.0).to(DT)


def logistic_loss(w: Tensor, log_lam: Tensor) -> Tensor:
    margins = Y_LOG * (X_LOG @ w[0])
    return torch.nn.functional.softplus(-margins).sum() + 0.5 * log_lam.exp() * w.square().sum()


def logistic_validation(w: Tensor) -> Tensor:
    return torch.nn.functional.softplus(-(Y_LOG[:10] * (X_LOG[:10] @ w.reshape(-1)) + 0.3)).sum()


def tight_logistic(log_lam: Tensor) -> Tensor:
    sol = ih.minimize(
        logistic_loss,
        torch.zeros(1, 4, dtype=DT),
        log_lam,
        solver=ih.NewtonCG(tol=1e-13),
    )
    return sol.value


@pytest.mark.parametrize("solver", [ih.LBFGS(tol=1e-12), ih.NewtonCG(tol=1e-12)], ids=repr)
def test_logistic_regression_hypergradient_matches_central_differences(solver) -> None:
    log_lam = torch.tensor(-0.5, dtype=DT, requires_grad=True)
    sol = ih.minimize(
        logistic_loss, torch.zeros(1, 4, dtype=DT), log_lam, solver=solver, adjoint=EXACT
    )
    (grad,) = torch.autograd.grad(logistic_validation(sol.value), log_lam)
    eps = 1e-5
    with torch.no_grad():
        up = logistic_validation(tight_logistic(log_lam + eps))
        down = logistic_validation(tight_logistic(log_lam - eps))
    fd = float(up - down) / (2 * eps)
    assert abs(float(grad) - fd) <= 1e-7 * abs(fd)


# --- a nonlinear least-squares curve fit y = a exp(b t) ------------------------------------

T = torch.linspace(0, 2, 25, dtype=DT)


def exp_residuals(p: Tensor, t: Tensor, y: Tensor) -> Tensor:
    return p[:, :1] * torch.exp(p[:, 1:] * t) - y


@pytest.mark.parametrize("solver", [ih.GaussNewton(), ih.LevenbergMarquardt()], ids=repr)
def test_curve_fit_recovers_the_parameters_and_its_gradient_matches_differences(solver) -> None:
    y = 2.0 * torch.exp(-1.5 * T)
    p0 = torch.tensor([[1.0, 0.0]], dtype=DT)
    sol = ih.least_squares(exp_residuals, p0, T, y, solver=solver)
    assert torch.allclose(sol.value, torch.tensor([[2.0, -1.5]], dtype=DT), rtol=0, atol=1e-9)
    noisy = (y + 0.05 * torch.randn(25, generator=gen(6), dtype=DT)).requires_grad_()
    sol = ih.least_squares(exp_residuals, p0, T, noisy, solver=solver, adjoint=EXACT)
    (grad,) = torch.autograd.grad(sol.value[0, 1], noisy)  # d b* / d y
    direction = torch.randn(25, generator=gen(7), dtype=DT)
    eps, tight = 1e-5, ih.GaussNewton(tol=1e-13)  # the reference: a tight independent solve
    with torch.no_grad():
        up = ih.least_squares(exp_residuals, p0, T, noisy + eps * direction, solver=tight)
        down = ih.least_squares(exp_residuals, p0, T, noisy - eps * direction, solver=tight)
    fd = float(up.value[0, 1] - down.value[0, 1]) / (2 * eps)
    assert abs(float(grad @ direction) - fd) <= 1e-6 * abs(fd)


def test_gauss_newton_and_levenberg_marquardt_agree_with_lbfgs() -> None:
    y = 2.0 * torch.exp(-1.5 * T) + 0.05 * torch.randn(25, generator=gen(8), dtype=DT)
    p0 = torch.tensor([[1.0, 0.0]], dtype=DT)
    values = [
        ih.least_squares(exp_residuals, p0, T, y, solver=s, adjoint=EXACT).value
        for s in (ih.GaussNewton(), ih.LevenbergMarquardt(), ih.LBFGS(tol=1e-10))
    ]
    assert all(torch.allclose(values[0], v, rtol=0, atol=1e-8) for v in values[1:])


# --- non-negative least squares with active constraints -------------------------------------

A_NN = torch.randn(15, 6, generator=gen(9), dtype=DT)


def nnls_loss(z: Tensor, b: Tensor) -> Tensor:
    return 0.5 * (A_NN @ z[0] - b).square().sum()


def nnls_solver() -> ih.GradientDescent:
    top = float(torch.linalg.eigvalsh(A_NN.T @ A_NN)[-1])
    return ih.GradientDescent(lr=1.0 / top, max_steps=20000, tol=1e-12)


def test_nnls_matches_the_active_set_formula_value_and_gradient() -> None:
    b = torch.randn(15, generator=gen(10), dtype=DT).requires_grad_()
    sol = ih.minimize(
        nnls_loss,
        torch.zeros(1, 6, dtype=DT),
        b,
        solver=nnls_solver(),
        adjoint=ih.Implicit(tol=1e-12, on_divergence="raise"),
        constraint=ih.NonNegative(),
    )
    z = sol.value.detach()[0]
    free = z > 1e-9
    assert 0 < int(free.sum()) < 6, "the case needs active and free constraints"
    a_f = A_NN[:, free]
    z_free = torch.linalg.solve(a_f.T @ a_f, a_f.T @ b.detach())
    assert torch.allclose(z[free], z_free, rtol=0, atol=1e-10)
    assert torch.equal(z[~free], torch.zeros_like(z[~free]))
    multipliers = (A_NN.T @ (A_NN @ z - b.detach()))[~free]
    assert bool((multipliers > 1e-8).all()), "strict complementarity on the active set"
    weights = torch.randn(6, generator=gen(11), dtype=DT)
    (grad,) = torch.autograd.grad((weights * sol.value[0]).sum(), b)
    expected = a_f @ torch.linalg.solve(a_f.T @ a_f, weights[free])
    assert torch.allclose(grad, expected, rtol=1e-9, atol=1e-11)


def test_box_constrained_gradient_matches_central_differences() -> None:
    b = torch.randn(15, generator=gen(12), dtype=DT).requires_grad_()
    box = ih.Box(-0.1, 0.15)

    def solve(rhs: Tensor, adjoint: ih.plugins.Adjoint) -> Tensor:
        return ih.minimize(
            nnls_loss,
            torch.zeros(1, 6, dtype=DT),
            rhs,
            solver=nnls_solver(),
            adjoint=adjoint,
            constraint=box,
        ).value

    value = solve(b, ih.Implicit(tol=1e-12))
    at_bounds = int(((value - 0.15).abs() < 1e-9).sum() + ((value + 0.1).abs() < 1e-9).sum())
    assert 0 < at_bounds < 6
    weights = torch.randn(6, generator=gen(13), dtype=DT)
    (grad,) = torch.autograd.grad((weights * value[0]).sum(), b)
    direction = torch.randn(15, generator=gen(14), dtype=DT)
    eps = 1e-6
    with torch.no_grad():
        up = (weights * solve(b + eps * direction, ih.OneStep())[0]).sum()
        down = (weights * solve(b - eps * direction, ih.OneStep())[0]).sum()
    fd = float(up - down) / (2 * eps)
    assert abs(float(grad @ direction) - fd) <= 1e-6 * max(abs(fd), 1e-3)


# --- the contract: value independent of the backward mode; loud failures ------------------


def test_the_value_does_not_depend_on_the_backward_mode() -> None:
    lam, X = ridge_inputs()
    z0 = torch.zeros(1, 5, dtype=DT)
    gd = gd_for_ridge(0.7, steps=300)
    modes = (ih.Unroll(), ih.Truncated(5), ih.OneStep(), EXACT, ih.Implicit(), ih.Neumann())
    values = [ih.minimize(ridge_loss, z0, lam, X, solver=gd, adjoint=m).value for m in modes]
    assert all(torch.equal(values[0], v) for v in values[1:])
    adjoints = (EXACT, ih.Implicit(linear_solver="dense"), ih.Implicit(linear_solver="gmres"))
    for solver in (ih.LBFGS(), ih.NewtonCG()):
        values = [
            ih.minimize(ridge_loss, z0, lam, X, solver=solver, adjoint=a).value for a in adjoints
        ]
        assert all(torch.equal(values[0], v) for v in values[1:])


def test_cg_refuses_a_saddle_point_with_the_curvature() -> None:
    """A solver stopped at a stationary point that is a saddle: CG must not answer."""
    theta = torch.tensor([[0.5, -0.25]], dtype=DT, requires_grad=True)
    scale = torch.tensor([1.0, -2.0], dtype=DT)

    def saddle(z: Tensor, theta: Tensor) -> Tensor:
        return 0.5 * (scale * z * z).sum() - (theta * z).sum()

    start = (theta / scale).detach()  # the stationary point itself: the solver stops at once
    sol = ih.minimize(saddle, start, theta)
    error = ih.errors.NotPositiveDefiniteError
    with pytest.raises(error, match=r"Hessian is not positive definite.*= -"):
        sol.value.sum().backward()
    sol = ih.minimize(saddle, start, theta, adjoint=ih.Implicit(linear_solver="gmres", tol=1e-12))
    (grad,) = torch.autograd.grad(sol.value.sum(), theta)
    assert torch.allclose(grad, 1 / scale.expand(1, 2))  # GMRES is fine with indefinite


def test_an_unconverged_minimize_warns_and_its_backward_applies_the_policy() -> None:
    lam, X = ridge_inputs()
    with pytest.warns(ih.ConvergenceWarning, match="lbfgs: did not reach tol"):
        sol = ih.minimize(
            ridge_loss,
            torch.zeros(1, 5, dtype=DT),
            lam,
            X,
            solver=ih.LBFGS(max_steps=1),
            adjoint=ih.Implicit(linear_solver="cg", on_divergence="raise"),
        )
    with pytest.raises(ih.NotFixedPointError, match=r"not a root of grad_z loss"):
        validation(sol.value).backward()


def test_misuse_is_refused_with_the_fix() -> None:
    lam, X = ridge_inputs()
    z0 = torch.zeros(1, 5, dtype=DT)
    with pytest.raises(ValueError, match=r"ih\.least_squares"):
        ih.minimize(ridge_loss, z0, lam, X, solver=ih.GaussNewton())
    with pytest.raises(ValueError, match="GradientDescent"):
        ih.minimize(ridge_loss, z0, lam, X, solver="lbfgs", constraint="nonnegative")
    with pytest.raises(ValueError, match="scalar"):
        ih.minimize(lambda w, lam, X: X @ w[0], z0, lam, X)
    with pytest.raises(ValueError, match="not differentiable steps"):
        ih.minimize(ridge_loss, z0, lam, X, solver=ih.LBFGS(), adjoint="unroll")
    with pytest.raises(KeyError, match="lbfgs"):
        ih.minimize(ridge_loss, z0, lam, X, solver="bfgs")
    with pytest.raises(TypeError, match="unknown option"):
        ih.plugins.MINIMIZERS.make("lbfgs", histroy=3)
    with pytest.raises(ValueError, match="lower must be <= upper"):
        ih.Box(1.0, 0.0)


def test_batched_independent_problems_are_solved_together() -> None:
    """B independent ridge problems (one per row of lams) in one state (B, 5)."""
    lams = torch.tensor([0.3, 1.0, 3.0], dtype=DT, requires_grad=True)

    def batched(w: Tensor, lams: Tensor) -> Tensor:
        fit = 0.5 * (w @ X_TR.T - Y_TR).square().sum()
        return fit + 0.5 * (lams[:, None] * w.square()).sum()

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sol = ih.minimize(batched, torch.zeros(3, 5, dtype=DT), lams, adjoint=EXACT)
    expected = torch.stack([ridge_closed_form(lam, X_TR) for lam in lams])
    assert torch.allclose(sol.value, expected.detach(), rtol=0, atol=1e-9)
    assert sol.stats.abs_residual.shape == (3,) and bool(sol.stats.converged.all())
    got = torch.autograd.grad(sum(validation(w) for w in sol.value), lams)[0]
    ref = torch.autograd.grad(sum(validation(w) for w in expected), lams)[0]
    assert torch.allclose(got, ref, rtol=1e-8)


@pytest.mark.parametrize(
    ("solver", "adjoint"),
    [(ih.LBFGS(tol=1e-11), EXACT), ("gd", ih.Unroll()), ("gd", EXACT)],
    ids=["lbfgs-implicit", "gd-unroll", "gd-implicit"],
)
def test_a_tuple_state_weights_and_bias(solver, adjoint) -> None:
    """Ridge with an unpenalised bias, the state a tuple (w (1, 5), b (1, 1)); closed form from
    the augmented normal equations."""
    lam, X = ridge_inputs()

    def loss(state: tuple[Tensor, Tensor], lam: Tensor, X: Tensor) -> Tensor:
        w, b = state
        return 0.5 * (X @ w[0] + b[0] - Y_TR).square().sum() + 0.5 * lam * w.square().sum()

    ones = torch.ones(20, 1, dtype=DT)
    aug = torch.cat([X, ones], dim=1)
    penalty = torch.diag(torch.cat([lam.expand(5), torch.zeros(1, dtype=DT)]))
    expected = torch.linalg.solve(aug.T @ aug + penalty, aug.T @ Y_TR)
    if solver == "gd":
        top = float(torch.linalg.eigvalsh((aug.T @ aug + penalty).detach())[-1])
        solver = ih.GradientDescent(lr=1.0 / top, max_steps=3000, tol=1e-11)
    z0 = (torch.zeros(1, 5, dtype=DT), torch.zeros(1, 1, dtype=DT))
    sol = ih.minimize(loss, z0, lam, X, solver=solver, adjoint=adjoint)
    w, b = sol.value
    assert torch.allclose(torch.cat([w[0], b[0]]), expected.detach(), rtol=0, atol=1e-9)
    got = torch.autograd.grad(validation(w) + b.sum(), (lam, X))
    want = torch.autograd.grad(validation(expected[:5]) + expected[5], (lam, X))
    for g, e in zip(got, want, strict=True):
        assert torch.allclose(g, e, rtol=1e-7, atol=1e-9)
