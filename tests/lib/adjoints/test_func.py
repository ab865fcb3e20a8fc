"""Every cell of the composability table in ``docs/composability.md`` is run here: "yes" cells
against an independent reference, "refused" cells must raise a clear error. Also: the unrolled
Jacobian equals the chain rule written out by hand, vmap equals the batched call, and the
refusals inside vmap (tolerance, accelerated solvers) are clear."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from helpers.registry_names import usable_names
from torch.func import grad, jacfwd, jacrev, vjp, vmap

import implicit_ham as ih

DT = torch.float64
STEPS = 12
TABLE = Path(__file__).resolve().parents[3] / "docs" / "composability.md"
MODES = {
    "unroll": ih.Unroll(),
    "truncated": ih.Truncated(3),
    "one_step": ih.OneStep(),
    "phantom": ih.Phantom(2, 0.5),
    "implicit": ih.Implicit(linear_solver="dense", fixed_point_tol=None),
    "neumann": ih.Neumann(k=4, fixed_point_tol=None),
}


def weights() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    W = torch.randn(4, 4, generator=gen, dtype=DT) * 0.3
    x = torch.randn(3, 4, generator=gen, dtype=DT)
    return W, x


def layer(
    adjoint: ih.plugins.Adjoint, W: torch.Tensor, solver: ih.plugins.FixedPointSolver | None = None
):
    def fn(x: torch.Tensor) -> torch.Tensor:
        return ih.fixed_point(
            lambda z, x: torch.tanh(z @ W + x),
            torch.zeros_like(x),
            x,
            solver=solver or ih.FixedPointIteration(max_steps=STEPS),
            adjoint=adjoint,
        ).value

    return fn


def autograd_jacobian(fn, x: torch.Tensor) -> torch.Tensor:
    """(3, 4, 3, 4): row by row with torch.autograd (the library's plain path)."""
    x = x.clone().requires_grad_()
    out = fn(x)
    rows = [torch.autograd.grad(out.reshape(-1)[i], x, retain_graph=True)[0] for i in range(12)]
    return torch.stack(rows).reshape(3, 4, 3, 4)


def cell(transform: str, fn, x: torch.Tensor) -> torch.Tensor:
    """The Jacobian (3, 4, 3, 4), or what the transform gives, reshaped to compare."""
    if transform == "torch.func.grad":
        return grad(lambda t: (fn(t) * torch.arange(12, dtype=DT).reshape(3, 4)).sum())(x)
    if transform == "torch.func.vjp":
        _out, pull = vjp(fn, x)
        return pull(torch.arange(12, dtype=DT).reshape(3, 4))[0]
    if transform == "torch.func.jacrev":
        return jacrev(fn)(x)
    if transform == "torch.func.jacfwd":
        return jacfwd(fn)(x)
    if transform == "torch.func.vmap":
        return vmap(fn)(x[:, None])[:, 0]
    if transform == "double backward (create_graph=True)":
        t = x.clone().requires_grad_()
        (g,) = torch.autograd.grad(fn(t).square().sum(), t, create_graph=True)
        return torch.autograd.grad(g.sum(), t)[0]
    t = x.clone().requires_grad_()
    return torch.autograd.grad((fn(t) * torch.arange(12, dtype=DT).reshape(3, 4)).sum(), t)[0]


def reference(transform: str, fn, x: torch.Tensor) -> torch.Tensor:
    """The same quantity through torch.autograd alone (no transform)."""
    if transform in ("torch.func.jacrev", "torch.func.jacfwd"):
        return autograd_jacobian(fn, x)
    if transform == "torch.func.vmap":
        with torch.no_grad():
            return fn(x)
    if transform == "double backward (create_graph=True)":
        return cell(transform, fn, x)  # checked separately against finite differences
    t = x.clone().requires_grad_()
    return torch.autograd.grad((fn(t) * torch.arange(12, dtype=DT).reshape(3, 4)).sum(), t)[0]


def table_cells() -> list[tuple[str, str, str]]:
    rows = [line for line in TABLE.read_text().splitlines() if line.startswith("| ")]
    header = [c.strip() for c in rows[0].strip("|").split("|")]
    cells = []
    for line in rows[1:]:
        parts = [c.strip() for c in line.strip("|").split("|")]
        cells += [
            (parts[0], mode, value) for mode, value in zip(header[1:], parts[1:], strict=True)
        ]
    return cells


def test_the_table_covers_every_mode_and_says_yes_or_refused() -> None:
    cells = table_cells()
    assert {mode for _, mode, _ in cells} == set(MODES)
    assert {value for _, _, value in cells} <= {"yes", "refused"}
    assert len(cells) == 7 * len(MODES)


@pytest.mark.parametrize(("transform", "mode", "value"), table_cells())
def test_every_table_cell_holds(transform: str, mode: str, value: str) -> None:
    W, x = weights()
    fn = layer(MODES[mode], W)
    if value == "refused":
        with pytest.raises(
            (NotImplementedError, ih.errors.SecondOrderError), match=r"torch\.func|create_graph"
        ):
            cell(transform, fn, x)
        return
    torch.testing.assert_close(
        cell(transform, fn, x), reference(transform, fn, x), rtol=1e-10, atol=1e-12
    )


def unrolled_jacobian(W: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """dz_K/dx for z <- tanh(z W + x) from 0, by the chain rule per sample: with
    z_{k+1} = tanh(a_k), a_k = z_k W + x, dz_{k+1}/dx = diag(1 - z_{k+1}^2) (W^T dz_k/dx + I)."""
    blocks = []
    for xi in x:
        z, jac = torch.zeros(4, dtype=DT), torch.zeros(4, 4, dtype=DT)
        for _ in range(STEPS):
            z = torch.tanh(z @ W + xi)
            jac = torch.diag(1 - z**2) @ (W.T @ jac + torch.eye(4, dtype=DT))
        blocks.append(jac)
    full = torch.zeros(3, 4, 3, 4, dtype=DT)
    for i, block in enumerate(blocks):
        full[i, :, i, :] = block
    return full


@pytest.mark.parametrize("transform", [jacrev, jacfwd])
def test_unroll_jacobian_under_torch_func_is_the_chain_rule(transform) -> None:
    W, x = weights()
    torch.testing.assert_close(
        transform(layer(ih.Unroll(), W))(x), unrolled_jacobian(W, x), rtol=1e-12, atol=1e-14
    )


def test_double_backward_through_unroll_matches_finite_differences() -> None:
    W, x = weights()
    fn = layer(ih.Unroll(), W)
    hvp = cell("double backward (create_graph=True)", fn, x)

    def first(t: torch.Tensor) -> torch.Tensor:
        t = t.clone().requires_grad_()
        return torch.autograd.grad(fn(t).square().sum(), t)[0]

    u, h = torch.ones_like(x), 1e-6
    torch.testing.assert_close(
        hvp, (first(x + h * u) - first(x - h * u)) / (2 * h), rtol=1e-6, atol=1e-8
    )


@pytest.mark.parametrize(
    "solver",
    [
        ih.FixedPointIteration(max_steps=20, tol=1e-6),
        ih.Anderson(max_steps=10),
        ih.Broyden(max_steps=10),
    ],
    ids=["tolerance", "anderson", "broyden"],
)
def test_value_dependent_solvers_are_refused_inside_vmap(solver) -> None:
    W, x = weights()
    with pytest.raises(NotImplementedError, match=re.escape("vmap")):
        vmap(layer(ih.OneStep(), W, solver))(x[:, None])


AT_POINT = [
    ih.Implicit(linear_solver="dense", fixed_point_tol=None),
    ih.Neumann(k=4, fixed_point_tol=None),
]


@pytest.mark.parametrize("ham", [ih.NMF, ih.VQ, ih.CD, ih.SVD])
@pytest.mark.parametrize("adjoint", [ih.OneStep(), ih.Unroll(), *AT_POINT], ids=lambda a: a.name)
def test_hams_compose_with_torch_func(ham, adjoint) -> None:
    """jacrev = jacfwd = the autograd Jacobian (the paper's one-step included: the no-grad
    steps carry no forward-mode tangent), and vmap over samples = the batched call."""
    gen = torch.Generator().manual_seed(3)
    x = torch.rand(1, 6, 3, 3, generator=gen, dtype=DT)
    bases = torch.nn.functional.normalize(torch.rand(1, 6, 2, generator=gen, dtype=DT), dim=1)
    layer = ham(rank=2, steps=3, adjoint=adjoint)

    def fn(t: torch.Tensor) -> torch.Tensor:
        return layer(t, init=bases)

    t = x.clone().requires_grad_()
    out = fn(t).reshape(-1)
    rows = [torch.autograd.grad(out[i], t, retain_graph=True)[0] for i in range(out.numel())]
    expected = torch.stack(rows).reshape(*x.shape, *x.shape)
    torch.testing.assert_close(jacrev(fn)(x), expected, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(jacfwd(fn)(x), expected, rtol=1e-10, atol=1e-12)
    pair = torch.cat([x, x.flip(-1)])
    with torch.no_grad():
        batched = ham(rank=2, steps=3)(pair, init=bases.repeat(2, 1, 1))
        mapped = vmap(lambda t: layer(t[None], init=bases)[0])(pair)
    torch.testing.assert_close(mapped, batched, rtol=1e-10, atol=1e-12)


def at_point_jacobian(W: torch.Tensor, x: torch.Tensor, k: int | None, tau: float = 1.0):
    """dz/dx (3, 4, 3, 4) at z_K (STEPS plain steps of z <- tanh(z W + x)) by the dense
    formula: per sample, with s = 1 - z_{K+1}^2, J = diag(s) W^T and f_x = diag(s),
    ``(I - J)^-1 f_x`` (Implicit, k None) or ``tau sum_{i<k} B^i f_x``, B = tau J + (1-tau) I
    (Neumann)."""
    eye = torch.eye(4, dtype=DT)
    full = torch.zeros(3, 4, 3, 4, dtype=DT)
    for i, xi in enumerate(x):
        z = torch.zeros(4, dtype=DT)
        for _ in range(STEPS):
            z = torch.tanh(z @ W + xi)
        s = 1 - torch.tanh(z @ W + xi) ** 2
        J, fx = torch.diag(s) @ W.T, torch.diag(s)
        if k is None:
            block = torch.linalg.solve(eye - J, fx)
        else:
            B, term, block = tau * J + (1 - tau) * eye, fx, torch.zeros_like(fx)
            for _ in range(k):
                block, term = block + term, B @ term
            block = tau * block
        full[i, :, i, :] = block
    return full


@pytest.mark.parametrize("transform", [jacrev, jacfwd])
def test_at_point_jacobians_under_torch_func_are_the_dense_formulas(transform) -> None:
    """Implicit (dense) and Neumann under jacrev (reverse) and jacfwd (forward mode, the
    Function's jvp: the forward system (I - J) t' = t) against the dense float64 formulas."""
    W, x = weights()
    implicit = transform(layer(MODES["implicit"], W))(x)
    torch.testing.assert_close(implicit, at_point_jacobian(W, x, None), rtol=1e-10, atol=1e-12)
    neumann = transform(layer(ih.Neumann(k=4, tau=0.7, fixed_point_tol=None), W))(x)
    expected = at_point_jacobian(W, x, 4, 0.7)
    torch.testing.assert_close(neumann, expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(
    "linear_solver", usable_names(ih.plugins.LINEAR_SOLVERS, where=lambda cls: cls.iterative)
)
def test_iterative_linear_solvers_work_under_grad_and_are_refused_under_vmap(linear_solver) -> None:
    """Under torch.func.grad / vjp the iterative solvers run with their checks (values can be
    read); under vmap (and jacrev, which vmaps the backward pass) a solver that stops on a
    tolerance is refused with a clear error."""
    W, x = weights()
    if linear_solver == "cg":  # CG needs a symmetric positive-definite I - J
        W = (W + W.T) / 2
    adjoint = ih.Implicit(
        linear_solver=linear_solver, tol=1e-12, max_steps=200, fixed_point_tol=None
    )
    fn = layer(adjoint, W)
    weight = torch.arange(12, dtype=DT).reshape(3, 4)
    got = grad(lambda t: (fn(t) * weight).sum())(x)
    expected = torch.einsum("ij,ijkl->kl", weight, at_point_jacobian(W, x, None))
    torch.testing.assert_close(got, expected, rtol=1e-8, atol=1e-10)
    with pytest.raises(NotImplementedError, match="vmap"):
        jacrev(fn)(x)


def test_nested_torch_func_differentiation_through_implicit_is_refused() -> None:
    """A second derivative by nested transforms would hold z* fixed: refused (torch.autograd
    with create_graph=True gives it, see test_core_second_order.py)."""
    W, x = weights()
    fn = layer(MODES["implicit"], W)
    with pytest.raises(ih.errors.SecondOrderError, match=r"nested torch\.func"):
        jacrev(grad(lambda t: fn(t).pow(2).sum()))(x)


def test_newton_root_under_torch_func_is_refused_clearly() -> None:
    """Newton's Jacobian products call torch.autograd inside; under torch.func the root layer
    refuses with an error naming the transform (``minimize`` and fixed-point ``root`` are
    supported there: tests/lib/adjoints/test_func_argmin.py)."""
    A = torch.eye(3, dtype=DT) * 2

    def fn(x: torch.Tensor) -> torch.Tensor:
        return ih.root(lambda z, x_: z @ A + torch.sinh(z) - x_, torch.zeros_like(x), x).value

    with pytest.raises(NotImplementedError, match=r"torch\.func \(Grad\)"):
        grad(lambda t: fn(t).sum())(torch.ones(2, 3, dtype=DT))
