"""torch.func through the gradient guard (forward mode: hessian, jacfwd, jvp) and through
``minimize`` / ``root`` (grad, vjp, jacrev), against dense float64 formulas."""

from __future__ import annotations

import pytest
import torch

import implicit_ham as ih
from implicit_ham._core.grad_guard import guard_gradient

F64 = torch.float64
STEPS = 30


def _map_data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    A = 0.3 * torch.randn(4, 4, generator=g, dtype=F64)
    x = torch.randn(1, 4, generator=g, dtype=F64)
    return A, x


def _unrolled_by_hand(x: torch.Tensor, A: torch.Tensor) -> torch.Tensor:
    """The same STEPS iterations of z <- tanh(z A + x) from 0, without the library."""
    z = torch.zeros_like(x)
    for _ in range(STEPS):
        z = torch.tanh(z @ A + x)
    return (z**2).sum()


def _through_the_layer(x: torch.Tensor, A: torch.Tensor) -> torch.Tensor:
    solver = ih.FixedPointIteration(max_steps=STEPS, tol=None)
    z = ih.fixed_point(lambda z, x: torch.tanh(z @ A + x), torch.zeros_like(x), x,
                       solver=solver, adjoint=ih.Unroll()).value  # fmt: skip
    return (z**2).sum()


def test_hessian_jacfwd_and_jvp_through_an_unrolled_layer_match_the_dense_formulas() -> None:
    A, x = _map_data()
    H_ref = torch.autograd.functional.hessian(lambda v: _unrolled_by_hand(v, A), x)
    H = torch.func.hessian(lambda v: _through_the_layer(v, A))(x)
    assert torch.allclose(H, H_ref, atol=1e-12)
    J_ref = torch.autograd.functional.jacobian(lambda v: _unrolled_by_hand(v, A), x)
    J = torch.func.jacfwd(lambda v: _through_the_layer(v, A))(x)
    assert torch.allclose(J, J_ref, atol=1e-12)
    t = torch.ones_like(x)
    _, tangent = torch.func.jvp(lambda v: _through_the_layer(v, A), (x,), (t,))
    assert torch.allclose(tangent, (J_ref * t).sum(), atol=1e-12)


def test_the_guard_is_the_identity_in_forward_mode_and_under_vmap() -> None:
    x = torch.randn(3, 2, dtype=F64)
    t = torch.randn(3, 2, dtype=F64)
    _, tangent = torch.func.jvp(lambda v: guard_gradient(v, "x") ** 2, (x,), (t,))
    assert torch.equal(tangent, 2 * x * t)
    per_row = torch.func.vmap(torch.func.grad(lambda v: (guard_gradient(v, "x") ** 3).sum()))(x)
    assert torch.allclose(per_row, 3 * x**2)


_G = torch.Generator().manual_seed(1)
_X, _Y = torch.randn(20, 3, generator=_G, dtype=F64), torch.randn(20, generator=_G, dtype=F64)


def _ridge() -> tuple[torch.Tensor, torch.Tensor]:
    """A 20 × 3 ridge problem (made outside any vmap: random ops are refused there)."""
    return _X, _Y


def _ridge_hypergradient(lam: float) -> torch.Tensor:
    """d ||w*||² / dλ for w* = (X^T X + λ I)^{-1} X^T y: -2 w*^T A^{-1} w*."""
    X, y = _ridge()
    A = X.T @ X + lam * torch.eye(3, dtype=F64)
    w = torch.linalg.solve(A, X.T @ y)
    return -2 * w @ torch.linalg.solve(A, w)


def _argmin_outer(lam: torch.Tensor, linear_solver: str, solver: str = "lbfgs"):
    X, y = _ridge()

    def loss(w, lam):
        return 0.5 * ((X @ w[0] - y) ** 2).sum() + 0.5 * lam * (w**2).sum()

    w = ih.minimize(loss, torch.zeros(1, 3, dtype=F64), lam, solver=solver,
                    adjoint=ih.Implicit(linear_solver=linear_solver)).value  # fmt: skip
    return (w**2).sum()


@pytest.mark.parametrize("linear_solver", ["dense", "cg"])
@pytest.mark.parametrize("solver", ["lbfgs", "newton_cg"])
def test_minimize_under_grad_vjp_and_jacrev_gives_the_closed_form(
    linear_solver: str, solver: str
) -> None:
    lam = torch.tensor(0.7, dtype=F64)
    ref = _ridge_hypergradient(0.7)
    fn = lambda v: _argmin_outer(v, linear_solver, solver)  # noqa: E731
    assert torch.allclose(torch.func.grad(fn)(lam), ref, atol=1e-8)
    (pulled,) = torch.func.vjp(fn, lam)[1](torch.tensor(1.0, dtype=F64))
    assert torch.allclose(pulled, ref, atol=1e-8)
    if linear_solver == "dense":
        assert torch.allclose(torch.func.jacrev(fn)(lam), ref, atol=1e-8)
    else:  # jacrev vmaps the backward pass: CG's stopping test cannot run there
        with pytest.raises(NotImplementedError, match="stops on a tolerance"):
            torch.func.jacrev(fn)(lam)


def test_minimize_and_root_under_vmap_are_refused_with_the_reason() -> None:
    lams = torch.tensor([0.5, 1.0], dtype=F64)
    with pytest.raises(NotImplementedError, match="read values on the host"):
        torch.func.vmap(torch.func.grad(lambda v: _argmin_outer(v, "dense")))(lams)


def _root_outer(lam: torch.Tensor, solver: object) -> torch.Tensor:
    X, y = _ridge()

    def g(z, lam):  # the ridge normal equations, scaled to make z - g(z) contractive
        return 0.02 * (z @ (X.T @ X) + lam * z - (X.T @ y)[None])

    z0 = torch.zeros(1, 3, dtype=F64)
    adjoint = ih.Implicit(linear_solver="dense")
    return (ih.root(g, z0, lam, solver=solver, adjoint=adjoint).value ** 2).sum()


def test_root_with_a_fixed_point_solver_under_grad_and_newton_refused() -> None:
    lam = torch.tensor(0.7, dtype=F64)
    anderson = ih.Anderson(tol=1e-13, max_steps=500)
    grad = torch.func.grad(lambda v: _root_outer(v, anderson))(lam)
    assert torch.allclose(grad, _ridge_hypergradient(0.7), atol=1e-8)
    with pytest.raises(NotImplementedError, match="use a fixed-point solver there"):
        torch.func.grad(lambda v: _root_outer(v, "newton"))(lam)
