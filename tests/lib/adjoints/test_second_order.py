"""Second derivatives (design.md: "a mode that cannot give a second derivative refuses
``create_graph=True`` instead of returning a wrong one").

Implicit and Neumann differentiate their own backward pass
(``implicit_ham/adjoints/second_order.py``):
the adjoint vector, f's partial derivatives at z* and the cross term along z*. References, all
float64 and independent of the library: the implicit-function theorem's second derivative
written out densely for ``z = tanh(W z + x)`` (the closed-form first-order gradient, pulled
back with ``torch.func.vjp`` and z*'s dense IFT Jacobian), and central differences of the
gradient. Neumann's second derivative is, by design, the derivative of its k-term series in
which z*'s own derivative is again the k-term series; the same dense formula with that
Jacobian checks it. A third derivative, and a plug-in mode without a second-order rule, are
refused with ``SecondOrderError``.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import pytest
import torch
from torch import Tensor
from torch.func import vjp

import implicit_ham as ih
from implicit_ham._core.stats import BackwardStats
from implicit_ham.linalg.operator import AdjointOperator

DT = torch.float64
SOLVER = ih.FixedPointIteration(max_steps=80)
TIGHT = {"tol": 1e-12, "max_steps": 200, "fixed_point_tol": None}


def problem(seed: int = 0, batch: int = 2, n: int = 4) -> tuple[Tensor, Tensor]:
    """x (B, n) and W (n, n) with ||W||_2 = 0.5: ``z = tanh(z W^T + x)`` is a contraction."""
    gen = torch.Generator().manual_seed(seed)
    W = torch.randn(n, n, generator=gen, dtype=DT)
    W = 0.5 * W / torch.linalg.matrix_norm(W, ord=2)
    return torch.randn(batch, n, generator=gen, dtype=DT), W


def plain_solution(x: Tensor, W: Tensor) -> Tensor:
    z = torch.zeros_like(x)
    for _ in range(200):
        z = torch.tanh(z @ W.T + x)
    return z


def loss_grad(z: Tensor) -> Tensor:
    """dL/dz for L = sum(z^3)."""
    return 3 * z**2


def adjoint_matrix(z: Tensor, x: Tensor, W: Tensor, k: int | None, tau: float) -> Tensor:
    """(B, n, n): per sample, the map v -> adjoint vector: ``(I - J^T)^-1`` (k None) or
    Neumann's ``tau * sum_{i<k} B^T^i``, ``B = tau J + (1 - tau) I``, J = diag(s) W."""
    s = 1 - torch.tanh(z @ W.T + x) ** 2
    eye = torch.eye(W.shape[0], dtype=DT)
    J = s[:, :, None] * W  # (B, n, n)
    if k is None:
        return torch.linalg.inv(eye - J.transpose(1, 2))
    B = tau * J + (1 - tau) * eye
    term, total = eye.expand_as(J), torch.zeros_like(J)
    for _ in range(k):
        total = total + term
        term = B.transpose(1, 2) @ term
    return tau * total


def closed_form_gradient(
    z: Tensor, x: Tensor, W: Tensor, k: int | None = None, tau: float = 1.0
) -> tuple[Tensor, Tensor]:
    """(dL/dx, dL/dW) at z as an explicit function of (z, x, W): with a = z W^T + x,
    s = 1 - tanh(a)^2 and u the adjoint vector of dL/dz, dL/dx = s u, dL/dW = sum_b (s u) z^T."""
    s = 1 - torch.tanh(z @ W.T + x) ** 2
    u = (adjoint_matrix(z, x, W, k, tau) @ loss_grad(z)[:, :, None])[:, :, 0]
    gx = s * u
    return gx, gx.T @ z


def dense_hvp(
    x: Tensor, W: Tensor, d: tuple[Tensor, Tensor], k: int | None = None, tau: float = 1.0
) -> tuple[Tensor, Tensor]:
    """The derivative of ``<gradient, d>`` with respect to (x, W): the partials of the closed
    form (torch.func.vjp at fixed z*), plus the z*-partial pulled back through z*'s Jacobian
    (the IFT one for k None; Neumann's k-term series otherwise)."""
    z = plain_solution(x, W)
    _, pull = vjp(lambda z_, x_, W_: closed_form_gradient(z_, x_, W_, k, tau), z, x, W)
    cz, cx, cW = pull(d)
    s = 1 - torch.tanh(z @ W.T + x) ** 2
    w = (adjoint_matrix(z, x, W, k, tau) @ cz[:, :, None])[:, :, 0] * s
    return cx + w, cW + w.T @ z


def library_gradient(
    adjoint: ih.plugins.Adjoint, x: Tensor, W: Tensor, create_graph: bool
) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]:
    """((dL/dx, dL/dW), (x, W) leaves): W is closed over by f, x is an argument."""
    x, W = x.clone().requires_grad_(), W.clone().requires_grad_()
    sol = ih.fixed_point(
        lambda z, x_: torch.tanh(z @ W.T + x_), torch.zeros_like(x), x,
        solver=SOLVER, adjoint=adjoint,
    )  # fmt: skip
    grads = torch.autograd.grad(sol.value.pow(3).sum(), (x, W), create_graph=create_graph)
    return (grads[0], grads[1]), (x, W)


def library_hvp(adjoint: ih.plugins.Adjoint, x: Tensor, W: Tensor, d: tuple[Tensor, Tensor]):
    (gx, gW), leaves = library_gradient(adjoint, x, W, create_graph=True)
    return torch.autograd.grad((gx * d[0]).sum() + (gW * d[1]).sum(), leaves)


def directions(seed: int, x: Tensor, W: Tensor) -> tuple[Tensor, Tensor]:
    gen = torch.Generator().manual_seed(seed)
    dx = torch.randn(x.shape, generator=gen, dtype=DT)
    return dx, torch.randn(W.shape, generator=gen, dtype=DT)


IMPLICIT = {
    "dense": ih.Implicit(linear_solver="dense", fixed_point_tol=None),
    "gmres": ih.Implicit(linear_solver="gmres", **TIGHT),
    "fixed_point": ih.Implicit(linear_solver="fixed_point", **TIGHT),
    "anderson": ih.Implicit(linear_solver="anderson", **TIGHT),
}


@pytest.mark.parametrize("name", IMPLICIT)
def test_implicit_hvp_is_the_dense_ift_second_derivative(name: str) -> None:
    x, W = problem()
    d = directions(1, x, W)
    got = library_hvp(IMPLICIT[name], x, W, d)
    expected = dense_hvp(x, W, d)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-9)


def test_implicit_hvp_matches_central_differences_of_the_gradient() -> None:
    """Independent of the dense formula: <H d, e> against central differences of <grad, d>
    (the closed-form gradient at the re-solved z*) along e."""
    x, W = problem(seed=2)
    d, e = directions(3, x, W), directions(4, x, W)
    hx, hW = library_hvp(IMPLICIT["dense"], x, W, d)

    def along(t: float) -> Tensor:
        xt, Wt = x + t * e[0], W + t * e[1]
        gx, gW = closed_form_gradient(plain_solution(xt, Wt), xt, Wt)
        return (gx * d[0]).sum() + (gW * d[1]).sum()

    h = 1e-5
    numeric = (along(h) - along(-h)) / (2 * h)
    analytic = (hx * e[0]).sum() + (hW * e[1]).sum()
    torch.testing.assert_close(analytic, numeric, rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize(("k", "tau"), [(3, 0.5), (6, 0.8)])
def test_neumann_hvp_is_the_derivative_of_its_k_term_series(k: int, tau: float) -> None:
    """Neumann's second derivative: its k-term series differentiated, with z*'s own Jacobian
    again the k-term series (so it is not the exact IFT one for small k, and is for large k)."""
    x, W = problem(seed=5)
    d = directions(6, x, W)
    got = library_hvp(ih.Neumann(k=k, tau=tau, fixed_point_tol=None), x, W, d)
    for a, b in zip(got, dense_hvp(x, W, d, k=k, tau=tau), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)
    exact = dense_hvp(x, W, d)
    assert not torch.allclose(got[0], exact[0], rtol=1e-3)  # a surrogate for small k
    large = library_hvp(ih.Neumann(k=80, tau=1.0, fixed_point_tol=None), x, W, d)
    for a, b in zip(large, exact, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-9)


def test_cg_hvp_on_a_gradient_step_map_matches_central_differences() -> None:
    """CG needs a symmetric positive-definite system: f(z) = z - eta (A z + tanh(z) - x) has
    J = I - eta H with H = A + diag(1 - tanh(z)^2) SPD, so I - J = eta H."""
    gen = torch.Generator().manual_seed(7)
    M = torch.randn(4, 4, generator=gen, dtype=DT)
    A = M @ M.T / 4 + torch.eye(4, dtype=DT)
    x0 = torch.randn(2, 4, generator=gen, dtype=DT)
    d = torch.randn(2, 4, generator=gen, dtype=DT)
    eta = 0.2

    def gradient(x: Tensor, adjoint: ih.plugins.Adjoint, create_graph: bool) -> Tensor:
        sol = ih.fixed_point(
            lambda z, x_: z - eta * (z @ A + torch.tanh(z) - x_), torch.zeros_like(x), x,
            solver=ih.FixedPointIteration(max_steps=300), adjoint=adjoint,
        )  # fmt: skip
        return torch.autograd.grad(torch.sin(sol.value).sum(), x, create_graph=create_graph)[0]

    cg = ih.Implicit(linear_solver="cg", **TIGHT)
    x = x0.clone().requires_grad_()
    (hvp,) = torch.autograd.grad((gradient(x, cg, True) * d).sum(), x)
    h, dense = 1e-5, ih.Implicit(linear_solver="dense", fixed_point_tol=None)
    up = gradient((x0 + h * d).requires_grad_(), dense, False)
    down = gradient((x0 - h * d).requires_grad_(), dense, False)
    torch.testing.assert_close(hvp, (up - down) / (2 * h), rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("ham", [ih.VQ, ih.CD])
@pytest.mark.parametrize("linear_solver", ["dense", "gmres"])  # the exact and the Krylov solve
def test_decomposition_hvp_matches_central_differences(ham, linear_solver: str) -> None:
    """A Hamburger decomposition (tuple state: bases and coefficients) under Implicit: the
    Hessian-vector product of a nonlinear loss of its output, against central differences."""
    gen = torch.Generator().manual_seed(3)
    x0 = torch.rand(1, 6, 3, 3, generator=gen, dtype=DT)
    bases = torch.nn.functional.normalize(torch.rand(1, 6, 2, generator=gen, dtype=DT), dim=1)
    weight, d = (torch.randn(x0.shape, generator=gen, dtype=DT) for _ in range(2))
    adjoint = ih.Implicit(linear_solver=linear_solver, **TIGHT)
    layer = ham(rank=2, steps=60, inv_t=1.0, adjoint=adjoint)

    def gradient(x: Tensor, create_graph: bool) -> Tensor:
        x = x.clone().requires_grad_() if not x.requires_grad else x
        out = layer(x, init=bases)
        return torch.autograd.grad((out * weight).sum() ** 2, x, create_graph=create_graph)[0]

    x = x0.clone().requires_grad_()
    (hvp,) = torch.autograd.grad((gradient(x, True) * d).sum(), x)
    h = 1e-6
    numeric = (gradient(x0 + h * d, False) - gradient(x0 - h * d, False)) / (2 * h)
    torch.testing.assert_close(hvp, numeric, rtol=1e-7, atol=1e-9)


def test_a_third_derivative_is_refused() -> None:
    x, W = problem()
    d = directions(1, x, W)
    (gx, gW), (xl, _) = library_gradient(IMPLICIT["dense"], x, W, create_graph=True)
    second = (gx * d[0]).sum() + (gW * d[1]).sum()
    with pytest.raises(ih.errors.SecondOrderError, match="third derivative"):
        torch.autograd.grad(second, xl, create_graph=True)


@dataclass(frozen=True)
class PlainSeries(ih.plugins.AtFixedPoint):
    """A plug-in at-fixed-point mode that defines only ``backward_solve`` (g = v + J^T v)."""

    fixed_point_tol: float | None = None
    on_divergence: str = "warn"

    def backward_solve(self, op: AdjointOperator, v: Tensor) -> tuple[Tensor, BackwardStats]:
        return v + op.vjp(v), BackwardStats("plain_series", "none", 1, 0.0, 0.0, None)


@pytest.mark.parametrize("nonlinear_loss", [False, True])
def test_a_mode_without_a_second_order_rule_refuses_create_graph(
    tanh_problem, nonlinear_loss
) -> None:
    p = tanh_problem(batch=2, width=4)
    sol = ih.fixed_point(p.f, p.z0, *p.args, solver=SOLVER, adjoint=PlainSeries())
    loss = (sol.value**2).sum() if nonlinear_loss else sol.value.sum()
    with pytest.raises(ih.errors.SecondOrderError, match="create_graph=True"):
        torch.autograd.grad(loss, p.args, create_graph=True)


def test_at_fixed_point_modes_still_give_first_derivatives(tanh_problem) -> None:
    p = tanh_problem(batch=2, width=4)
    sol = ih.fixed_point(p.f, p.z0, *p.args, solver=SOLVER, adjoint=ih.Implicit())
    grads = torch.autograd.grad((sol.value**2).sum(), p.args, retain_graph=True)
    again = torch.autograd.grad((sol.value**2).sum(), p.args)
    assert all(torch.equal(a, b) and bool(a.any()) for a, b in zip(grads, again, strict=True))


def test_create_graph_first_derivative_equals_the_plain_one() -> None:
    x, W = problem()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plain, _ = library_gradient(IMPLICIT["gmres"], x, W, create_graph=False)
        graphed, _ = library_gradient(IMPLICIT["gmres"], x, W, create_graph=True)
    for a, b in zip(graphed, plain, strict=True):
        torch.testing.assert_close(a.detach(), b, rtol=0, atol=0)


def test_unroll_second_derivative_matches_finite_differences(tanh_problem) -> None:
    p = tanh_problem(batch=2, width=4)
    x, W = p.args
    u = torch.randn(x.shape, dtype=x.dtype, generator=torch.Generator().manual_seed(0))

    def directional_grad(x_: torch.Tensor, create_graph: bool) -> torch.Tensor:
        sol = ih.fixed_point(p.f, p.z0, x_, W, solver=SOLVER, adjoint=ih.Unroll())
        (g,) = torch.autograd.grad((sol.value**2).sum(), x_, create_graph=create_graph)
        return (g * u).sum()

    (hessian_u,) = torch.autograd.grad(directional_grad(x, True), x)
    d = torch.randn(x.shape, dtype=x.dtype, generator=torch.Generator().manual_seed(1))
    eps = 1e-6
    up = directional_grad((x + eps * d).detach().requires_grad_(), False)
    down = directional_grad((x - eps * d).detach().requires_grad_(), False)
    numeric = float((up - down) / (2 * eps))
    assert abs(float((hessian_u * d).sum()) - numeric) <= 1e-6 * max(1.0, abs(numeric))


# the exact and the Krylov solves (CG too: these Jacobians are symmetric positive-definite)
@pytest.mark.parametrize("kind", ["root", "minimize"])
@pytest.mark.parametrize("linear_solver", ["dense", "gmres", "cg"])
def test_root_and_minimize_hvp_match_central_differences(kind: str, linear_solver: str) -> None:
    """``ih.root`` / ``ih.minimize`` share the Function: their Hessian-vector products (root of
    g(z) = z A + sinh(z) - x; argmin of a strictly convex loss) match central differences of
    the gradient."""
    gen = torch.Generator().manual_seed(0)
    M = torch.randn(3, 3, generator=gen, dtype=DT)
    A = M @ M.T / 3 + torch.eye(3, dtype=DT)
    x0, d = torch.randn(2, 3, generator=gen, dtype=DT), torch.randn(2, 3, generator=gen, dtype=DT)

    def gradient(x: Tensor, adjoint: ih.plugins.Adjoint, create_graph: bool) -> Tensor:
        if kind == "root":
            sol = ih.root(
                lambda z, x_: z @ A + torch.sinh(z) - x_, torch.zeros_like(x), x, adjoint=adjoint
            )
        else:
            sol = ih.minimize(
                lambda z, x_: 0.5 * (z @ A * z).sum() + torch.cosh(z).sum() - (z * x_).sum(),
                torch.zeros_like(x), x,
                solver=ih.LBFGS(tol=1e-13, max_steps=500), adjoint=adjoint,
            )  # fmt: skip
        loss = torch.sin(sol.value).sum() + sol.value.pow(3).sum()
        return torch.autograd.grad(loss, x, create_graph=create_graph)[0]

    x = x0.clone().requires_grad_()
    adjoint = ih.Implicit(linear_solver=linear_solver, **TIGHT)
    (hvp,) = torch.autograd.grad((gradient(x, adjoint, True) * d).sum(), x)
    h, dense = 1e-5, ih.Implicit(linear_solver="dense")
    up = gradient((x0 + h * d).requires_grad_(), dense, False)
    down = gradient((x0 - h * d).requires_grad_(), dense, False)
    torch.testing.assert_close(hvp, (up - down) / (2 * h), rtol=1e-7, atol=1e-9)
