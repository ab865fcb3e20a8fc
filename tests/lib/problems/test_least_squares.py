"""``ih.least_squares`` on batches of independent problems, in float32, with robust losses and
through the Gauss-Newton / LM iterations, each against an independent reference: separate
float64 solves, the dense implicit-function-theorem gradient (``torch.func`` Hessians),
``scipy.optimize.least_squares`` and central finite differences."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.optimize
import torch
from torch import Tensor

import implicit_ham as ih

DT = torch.float64
X = torch.linspace(0, 1, 100, dtype=DT)
SOLVERS = [ih.GaussNewton(), ih.LevenbergMarquardt()]


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def curve_data(batch: int, seed: int = 0, noise: float = 0.01) -> Tensor:
    """y = exp(a x + b) + noise, one (a, b) per sample: Theseus's curve-fitting problem."""
    g = gen(seed)
    a = 0.5 + torch.rand(batch, 1, generator=g, dtype=DT)
    b = torch.rand(batch, 1, generator=g, dtype=DT)
    return torch.exp(a * X + b) + noise * torch.randn(batch, 100, generator=g, dtype=DT)


def exp_fit(p: Tensor, y: Tensor) -> Tensor:
    return torch.exp(p[:, :1] * X.to(p.dtype) + p[:, 1:]) - y


def single_cost(p: Tensor, y: Tensor) -> Tensor:
    """½||r||² of one sample, p (2,), y (100,)."""
    return 0.5 * (torch.exp(p[0] * X + p[1]) - y).square().sum()


def ift_gradient(p_star: Tensor, y: Tensor, weights: Tensor) -> Tensor:
    """d(Σ weights · p*)/dy by the implicit-function theorem with the full Hessian, per sample
    (dense float64 ``torch.func`` derivatives of the single-sample cost)."""
    rows = []
    for p, yb, w in zip(p_star, y, weights, strict=True):
        hess = torch.func.hessian(single_cost)(p, yb)
        cross = torch.func.jacrev(torch.func.grad(single_cost), argnums=1)(p, yb)  # (2, 100)
        rows.append(-cross.T @ torch.linalg.solve(hess, w))
    return torch.stack(rows)


@pytest.mark.parametrize("solver", SOLVERS, ids=repr)
def test_a_batch_is_its_samples_solved_separately_with_the_ift_gradient(solver) -> None:
    y = curve_data(16).requires_grad_()
    sol = ih.least_squares(exp_fit, torch.zeros(16, 2, dtype=DT), y, solver=solver)
    assert isinstance(sol.stats, ih.LeastSquaresStats) and sol.stats.converged.all()
    assert sol.stats.abs_residual.shape == (16,) and len(sol.stats.status) == 16
    for b in (0, 7, 15):  # each sample alone (B = 1) gives the same minimiser
        alone = ih.least_squares(exp_fit, torch.zeros(1, 2, dtype=DT), y[b : b + 1].detach())
        assert torch.allclose(sol.value[b], alone.value[0], rtol=0, atol=1e-10)
    weights = torch.randn(16, 2, generator=gen(1), dtype=DT)
    (grad,) = torch.autograd.grad((sol.value * weights).sum(), y)
    expected = ift_gradient(sol.value.detach(), y.detach(), weights)
    assert float((grad - expected).abs().max()) <= 1e-6 * float(expected.abs().max())
    assert sol.backward_stats.linear_solver == "PerSampleDense"


def test_coupled_batch_gives_the_same_result_for_independent_samples() -> None:
    y = curve_data(4, seed=2).requires_grad_()
    z0 = torch.zeros(4, 2, dtype=DT)
    apart = ih.least_squares(exp_fit, z0, y)
    tight = ih.Implicit(linear_solver="cg", tol=1e-12)  # the coupled default: CG to 1e-5
    together = ih.least_squares(exp_fit, z0, y, batch_coupled=True, adjoint=tight)
    assert torch.allclose(apart.value, together.value, rtol=0, atol=1e-9)
    weights = torch.randn(4, 2, generator=gen(3), dtype=DT)
    (g1,) = torch.autograd.grad((apart.value * weights).sum(), y)
    (g2,) = torch.autograd.grad((together.value * weights).sum(), y)
    assert torch.allclose(g1, g2, rtol=1e-7, atol=1e-10)


def test_a_residual_that_couples_samples_is_detected_or_solved_as_one() -> None:
    y = curve_data(3, seed=4)

    def shared(p: Tensor, y: Tensor) -> Tensor:  # every sample sees the batch mean of b
        return exp_fit(p, y) + 0.1 * p[:, 1].mean()

    with pytest.raises(ValueError, match="batch_coupled=True"):
        ih.least_squares(shared, torch.zeros(3, 2, dtype=DT), y)
    sol = ih.least_squares(shared, torch.zeros(3, 2, dtype=DT), y, batch_coupled=True)
    flat = sol.value.detach().reshape(-1).requires_grad_()
    (grad,) = torch.autograd.grad(0.5 * shared(flat.reshape(3, 2), y).square().sum(), flat)
    assert sol.stats.converged.all() and float(grad.abs().max()) <= 1e-8


def test_per_sample_residuals_must_be_batch_first() -> None:
    y = curve_data(3)
    with pytest.raises(ValueError, match=r"batch first.*batch_coupled"):
        ih.least_squares(lambda p, y: exp_fit(p, y).T, torch.zeros(3, 2, dtype=DT), y)


@pytest.mark.parametrize("solver", SOLVERS, ids=repr)
def test_float32_converges_at_the_defaults_with_the_float64_hypergradient(solver) -> None:
    y64 = curve_data(16, seed=5)
    weights = torch.randn(16, 2, generator=gen(6), dtype=DT)
    grads = {}
    for dtype in (torch.float32, torch.float64):
        y = y64.to(dtype).requires_grad_()
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no ConvergenceWarning, no NotFixedPointWarning
            sol = ih.least_squares(exp_fit, torch.zeros(16, 2, dtype=dtype), y, solver=solver)
            (grads[dtype],) = torch.autograd.grad((sol.value * weights.to(dtype)).sum(), y)
        assert sol.stats.converged.all()
        assert set(sol.stats.status) <= {"gradient", "step", "rounding floor"}
        assert sol.stats.steps < solver.max_steps
    gap = float((grads[torch.float32].double() - grads[torch.float64]).abs().max())
    assert gap <= 1e-4


def test_an_explicit_tolerance_below_the_dtype_ends_at_the_rounding_floor() -> None:
    y = curve_data(2, seed=7).float()
    with pytest.warns(ih.ConvergenceWarning, match="rounding floor"):
        sol = ih.least_squares(exp_fit, torch.zeros(2, 2), y, solver=ih.GaussNewton(tol=1e-30))
    assert sol.stats.steps < 50 and set(sol.stats.status) == {"rounding floor"}
    assert not sol.stats.converged.any()


# --- robust losses --------------------------------------------------------------------------


def outlier_data(seed: int = 8) -> Tensor:
    y = curve_data(3, seed=seed, noise=0.05)
    y[:, ::10] += 2.0  # every tenth point an outlier
    return y


def scipy_fit(y: np.ndarray, loss: object, start: np.ndarray, scale: float) -> np.ndarray:
    x = X.numpy()

    def fun(p: np.ndarray) -> np.ndarray:
        return np.exp(p[0] * x + p[1]) - y

    tight = {"xtol": 1e-15, "ftol": 1e-15, "gtol": 1e-15}
    return scipy.optimize.least_squares(fun, start, loss=loss, f_scale=scale, **tight).x


def tukey_for_scipy(z: np.ndarray) -> np.ndarray:
    """scipy's callable-loss form of Tukey's biweight: rows ρ, ρ', ρ''."""
    inside = z <= 1
    return np.stack(
        [
            np.where(inside, (1 - (1 - z) ** 3) / 3, 1 / 3),
            np.where(inside, (1 - z) ** 2, 0.0),
            np.where(inside, -2 * (1 - z), 0.0),
        ]
    )


@pytest.mark.parametrize("kind", ["huber", "soft_l1", "cauchy", "arctan", "tukey"])
@pytest.mark.parametrize("solver", SOLVERS, ids=repr)
def test_robust_minimisers_match_scipy(kind: str, solver) -> None:
    y, scale = outlier_data(), 0.2
    start = ih.least_squares(exp_fit, torch.zeros(3, 2, dtype=DT), y).value  # the plain fit
    if kind == "tukey":  # not convex: start from the Huber fit, as scipy does below
        start = ih.least_squares(exp_fit, start, y, loss="huber", f_scale=scale).value
    sol = ih.least_squares(exp_fit, start, y, solver=solver, loss=kind, f_scale=scale)
    assert sol.stats.converged.all()
    for b in range(3):
        yb = y[b].numpy()
        if kind == "tukey":
            begin = scipy_fit(yb, "huber", np.zeros(2), scale)
            reference = scipy_fit(yb, tukey_for_scipy, begin, scale)
        else:  # scipy's trust region from zeros: an independent path to the same minimiser
            reference = scipy_fit(yb, kind, np.zeros(2), scale)
        assert np.abs(sol.value[b].numpy() - reference).max() <= 1e-7
    plain = ih.least_squares(exp_fit, torch.zeros(3, 2, dtype=DT), y).value
    assert float((sol.value - plain).abs().max()) > 1e-3  # the outliers do matter


@pytest.mark.parametrize("kind", ["huber", "cauchy", "tukey"])
def test_robust_implicit_gradient_matches_finite_differences(kind: str) -> None:
    y = outlier_data(seed=9).requires_grad_()
    loss = ih.RobustLoss(kind, scale=0.2)
    start = ih.least_squares(exp_fit, torch.zeros(3, 2, dtype=DT), y.detach(), loss="huber",
                             f_scale=0.2).value
    sol = ih.least_squares(exp_fit, start, y, loss=loss, solver=ih.GaussNewton(tol=1e-12))
    weights = torch.randn(3, 2, generator=gen(10), dtype=DT)
    (grad,) = torch.autograd.grad((sol.value * weights).sum(), y)
    direction = torch.randn(3, 100, generator=gen(11), dtype=DT)
    eps, tight = 1e-5, ih.GaussNewton(tol=1e-13)  # central: O(eps²), solve errors / eps
    with torch.no_grad():
        up = ih.least_squares(exp_fit, start, y + eps * direction, loss=loss, solver=tight)
        down = ih.least_squares(exp_fit, start, y - eps * direction, loss=loss, solver=tight)
    fd = float(((up.value - down.value) * weights).sum()) / (2 * eps)
    assert abs(float((grad * direction).sum()) - fd) <= 1e-6 * abs(fd)


def test_a_non_positive_scale_is_refused() -> None:
    y = curve_data(2)
    for scale in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="positive"):
            ih.least_squares(exp_fit, torch.zeros(2, 2, dtype=DT), y, loss="huber", f_scale=scale)
    with pytest.raises(ValueError, match="kind"):
        ih.RobustLoss("l1")


# --- through the iterations ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("solver", "loss", "towards"),
    [
        (ih.GaussNewton(max_steps=4), "linear", ("y", "z0")),
        (ih.GaussNewton(max_steps=4), "huber", ("y", "z0")),
        # LM's damping is a constant of the gradient; it starts from the Jacobian at z0, which
        # does not depend on y for the linear loss: the unrolled LM is then differentiable in y
        (ih.LevenbergMarquardt(max_steps=6), "linear", ("y",)),
    ],
    ids=repr,
)
def test_unroll_is_the_derivative_of_the_unrolled_solve(solver, loss, towards) -> None:
    y = outlier_data(seed=12).requires_grad_()
    z0 = torch.full((3, 2), 0.3, dtype=DT, requires_grad=True)
    kw = {"solver": solver, "loss": loss, "f_scale": 0.5}
    weights = torch.randn(3, 2, generator=gen(13), dtype=DT)
    directions = {
        "y": torch.randn(3, 100, generator=gen(14), dtype=DT),
        "z0": torch.randn(3, 2, generator=gen(15), dtype=DT),
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ih.ConvergenceWarning)  # 4-6 steps: not converged
        sol = ih.least_squares(exp_fit, z0, y, adjoint=ih.Unroll(), **kw)
        pair = torch.autograd.grad((sol.value * weights).sum(), (y, z0))
        grads = dict(zip(("y", "z0"), pair, strict=True))
        assert torch.equal(sol.value, ih.least_squares(exp_fit, z0, y, **kw).value)  # same value
        eps = 1e-6
        for at in towards:
            with torch.no_grad():
                values = []
                for sign in (1, -1):
                    step = sign * eps * directions[at]
                    yy, zz = (y + step, z0) if at == "y" else (y, z0 + step)
                    values.append(ih.least_squares(exp_fit, zz, yy, **kw).value)
            fd = float(((values[0] - values[1]) * weights).sum()) / (2 * eps)
            got = float((grads[at] * directions[at]).sum())
            assert abs(got - fd) <= 1e-6 * max(abs(fd), 1e-3), at


def test_truncated_is_the_derivative_of_the_last_steps() -> None:
    """GaussNewton keeps no state between steps, so the last k steps are a GaussNewton solve of
    k steps from the iterate the first K - k steps reach."""
    y = curve_data(3, seed=16).requires_grad_()
    z0 = torch.zeros(3, 2, dtype=DT)
    total, k = 5, 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ih.ConvergenceWarning)
        sol = ih.least_squares(
            exp_fit, z0, y, solver=ih.GaussNewton(max_steps=total), adjoint=ih.Truncated(k)
        )
        weights = torch.randn(3, 2, generator=gen(17), dtype=DT)
        (grad,) = torch.autograd.grad((sol.value * weights).sum(), y)
        with torch.no_grad():
            head = ih.least_squares(exp_fit, z0, y, solver=ih.GaussNewton(max_steps=total - k))
            direction, eps = torch.randn(3, 100, generator=gen(18), dtype=DT), 1e-6
            tail = ih.GaussNewton(max_steps=k)
            up = ih.least_squares(exp_fit, head.value, y + eps * direction, solver=tail).value
            down = ih.least_squares(exp_fit, head.value, y - eps * direction, solver=tail).value
    assert sol.stats.steps == total
    fd = float(((up - down) * weights).sum()) / (2 * eps)
    assert abs(float((grad * direction).sum()) - fd) <= 1e-6 * abs(fd)
