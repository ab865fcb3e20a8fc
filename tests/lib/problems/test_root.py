"""``ih.root``: g(z, θ) = 0 solved by Newton / fixed-point solvers on z - g, differentiated
through the optimality condition; checked against closed forms and finite differences."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import Tensor

import implicit_ham as ih

DT = torch.float64


def cube(z: Tensor, a: Tensor) -> Tensor:
    """g(z, a) = z^3 - a: the root is a^(1/3), dz/da = 1 / (3 a^(2/3))."""
    return z**3 - a


def positive(seed: int = 0) -> Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (0.5 + 3 * torch.rand(3, 4, generator=gen, dtype=DT)).requires_grad_()


@pytest.mark.parametrize(
    "solver",
    [
        ih.Newton(tol=1e-13),
        ih.Newton(linear_solver="dense", tol=1e-13),
        ih.Broyden(max_steps=100, tol=1e-13, stop_mode="abs"),
    ],
    ids=["newton_gmres", "newton_dense", "broyden_on_z_minus_g"],
)
@pytest.mark.parametrize(  # a Krylov, the dense and an accelerated solve; not every solver
    "linear_solver", ["gmres", "dense", "broyden"], ids=lambda s: f"backward_{s}"
)
def test_cube_root_value_and_gradient_match_the_closed_form(solver, linear_solver) -> None:
    a = positive()
    adjoint = ih.Implicit(linear_solver=linear_solver, tol=1e-12, on_divergence="raise")
    sol = ih.root(cube, torch.ones(3, 4, dtype=DT), a, solver=solver, adjoint=adjoint)
    (grad,) = torch.autograd.grad(sol.value.sum(), a)
    expected = a.detach() ** (1 / 3)
    tol = 1e-7 if isinstance(solver, ih.Broyden) else 1e-12
    assert torch.allclose(sol.value, expected, rtol=0, atol=tol)
    assert torch.allclose(grad, 1 / (3 * expected**2), rtol=10 * tol, atol=0)
    assert sol.backward_stats.converged and sol.backward_stats.at_fixed_point


def coupled(z: Tensor, x: Tensor, A: Tensor) -> Tensor:
    """A coupled nonlinear system: g(z) = z A^T + 0.1 z^3 + mean_batch(z) - x."""
    return z @ A.T + 0.1 * z**3 + z.mean(0, keepdim=True) - x


def coupled_inputs() -> tuple[Tensor, Tensor]:
    gen = torch.Generator().manual_seed(3)
    m = torch.randn(4, 4, generator=gen, dtype=DT)
    A = (2 * torch.eye(4, dtype=DT) + 0.3 * m).requires_grad_()
    x = torch.randn(3, 4, generator=gen, dtype=DT).requires_grad_()
    return x, A


def reference_root(x: Tensor, A: Tensor) -> Tensor:
    """An independent plain Newton loop on the flattened system, dense Jacobian by jacrev."""
    z = torch.zeros(3, 4, dtype=DT)
    for _ in range(30):
        jac = torch.func.jacrev(lambda y: coupled(y.reshape(3, 4), x, A).reshape(-1))(z.reshape(-1))
        z = z - torch.linalg.solve(jac, coupled(z, x, A).reshape(-1)).reshape(3, 4)
    return z


def test_coupled_system_gradient_matches_central_differences() -> None:
    x, A = coupled_inputs()
    weights = torch.randn(3, 4, generator=torch.Generator().manual_seed(5), dtype=DT)
    sol = ih.root(
        coupled,
        torch.zeros(3, 4, dtype=DT),
        x,
        A,
        solver=ih.Newton(tol=1e-13),
        adjoint=ih.Implicit(tol=1e-12),
    )
    with torch.no_grad():
        assert torch.allclose(sol.value, reference_root(x, A), atol=1e-12, rtol=0)
    grads = torch.autograd.grad((weights * sol.value).sum(), (x, A))
    eps = 1e-6
    for t, g in zip((x, A), grads, strict=True):
        direction = torch.randn(t.shape, generator=torch.Generator().manual_seed(9), dtype=DT)
        with torch.no_grad():
            up = (weights * reference_root(*_shift(x, A, t, eps * direction))).sum()
            down = (weights * reference_root(*_shift(x, A, t, -eps * direction))).sum()
        fd = float(up - down) / (2 * eps)
        assert abs(float((g * direction).sum()) - fd) <= 1e-7 * max(1.0, abs(fd))


def _shift(x: Tensor, A: Tensor, which: Tensor, delta: Tensor) -> tuple[Tensor, Tensor]:
    return (x + delta, A) if which is x else (x, A + delta)


def test_the_value_does_not_depend_on_the_backward_mode() -> None:
    x, A = coupled_inputs()

    def solve(solver, adjoint) -> Tensor:
        return ih.root(coupled, torch.zeros(3, 4, dtype=DT), x, A, solver=solver, adjoint=adjoint)

    damped = ih.FixedPointIteration(max_steps=60, damping=0.3)
    values = [
        solve(damped, adjoint).value
        for adjoint in (ih.Unroll(), ih.Truncated(4), ih.OneStep(), ih.Implicit(), ih.Neumann())
    ]
    assert all(torch.equal(values[0], v) for v in values[1:])
    newton = [
        solve(ih.Newton(), adjoint).value
        for adjoint in (ih.Implicit(), ih.Implicit(linear_solver="dense"), ih.Neumann())
    ]
    assert all(torch.equal(newton[0], v) for v in newton[1:])


def test_unrolled_damped_iterations_approach_the_implicit_gradient() -> None:
    x, A = coupled_inputs()
    damped = ih.FixedPointIteration(max_steps=200, damping=0.3)
    grads = []
    for adjoint in (ih.Unroll(), ih.Implicit(tol=1e-12)):
        sol = ih.root(coupled, torch.zeros(3, 4, dtype=DT), x, A, solver=damped, adjoint=adjoint)
        grads.append(torch.autograd.grad(sol.value.square().sum(), (x, A)))
    for unrolled, implicit in zip(*grads, strict=True):
        assert torch.allclose(unrolled, implicit, rtol=1e-8, atol=1e-10)


def test_an_unconverged_solve_warns_then_the_backward_check_applies_the_policy() -> None:
    a = positive()
    with pytest.warns(ih.ConvergenceWarning, match="newton: did not reach tol"):
        sol = ih.root(
            cube,
            torch.ones(3, 4, dtype=DT),
            a,
            solver=ih.Newton(max_steps=1),
            adjoint=ih.Implicit(on_divergence="raise"),
        )
    with pytest.raises(ih.NotFixedPointError, match=r"not a root of g: \|\|g\(z\*\)\|\| = "):
        sol.value.sum().backward()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ih.ConvergenceWarning)
        sol = ih.root(
            cube,
            torch.ones(3, 4, dtype=DT),
            a,
            solver=ih.Newton(max_steps=1),
            adjoint=ih.Implicit(on_divergence="fallback"),
        )
        with pytest.warns(ih.NotFixedPointWarning, match="fallback"):
            (grad,) = torch.autograd.grad(sol.value.sum(), a)
    assert torch.equal(grad, torch.ones_like(grad))  # one step of z - g: d(-g)/da = 1
    assert sol.backward_stats.fallback and sol.backward_stats.at_fixed_point is False


def test_refusals_name_the_alternatives() -> None:
    a = positive()
    z0 = torch.ones(3, 4, dtype=DT)
    with pytest.raises(ValueError, match="dense Jacobian"):
        big = torch.ones(2, 2049, dtype=DT)
        ih.root(cube, big, big + 1, solver=ih.Newton(), adjoint=ih.Unroll())
    with pytest.raises(ValueError, match="phantom is not available"):
        ih.root(cube, z0, a, adjoint=ih.Phantom())
    with pytest.raises(ValueError, match="ridge"):
        ih.root(cube, z0, a, adjoint=ih.Implicit(ridge=0.1))
    with pytest.raises(KeyError, match=r"newton.*fixed_point"):
        ih.root(cube, z0, a, solver="newtonn")
    with pytest.raises(ValueError, match="same structure"):
        ih.root(lambda z, a: (z, z), z0, a)
    with pytest.raises(ih.NonFiniteError, match="non-finite residual"):
        ih.root(cube, torch.full((3, 4), float("nan"), dtype=DT), a)
    assert ih.root(cube, z0, a, solver="newton").stats.solver == "newton"


def test_cg_on_an_indefinite_jacobian_fails_loudly_with_the_curvature() -> None:
    """g(z) = z diag(1, -2, 3) - x: dg/dz is symmetric and indefinite."""
    x = torch.randn(1, 3, dtype=DT, requires_grad=True)
    scale = torch.tensor([1.0, -2.0, 3.0], dtype=DT)
    sol = ih.root(
        lambda z, x: z * scale - x,
        torch.zeros(1, 3, dtype=DT),
        x,
        adjoint=ih.Implicit(linear_solver="cg"),
    )
    assert torch.allclose(sol.value, x.detach() / scale)
    with pytest.raises(
        ih.errors.NotPositiveDefiniteError, match=r"dg/dz is not positive definite.*p\^T A p = -"
    ):
        sol.value.sum().backward()
