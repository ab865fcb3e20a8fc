"""``RidgeNMF``: NMF posed as the argmin of a ridge-regularised loss under non-negativity (issue
18, item 4). Its fixed point satisfies the KKT conditions of that loss; with sparse factors the
ridge and the active constraints leave a well-conditioned I − J, where NMF's multiplicative
updates are nearly singular (the full measurement: experiments/studies/ridge_conditioning/nmf.py).
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

import implicit_ham as ih

F64 = torch.float64
STEPS = 4000


def sparse_input(d: int = 8, n: int = 10, r: int = 2, seed: int = 0) -> tuple[Tensor, Tensor]:
    """x (1, d, 2, n/2), a non-negative map W Hᵀ + noise from half-sparse factors, and initial
    bases (1, d, r)."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.rand(d, r, generator=gen, dtype=F64) * (
        torch.rand(d, r, generator=gen, dtype=F64) < 0.5
    )
    h = torch.rand(n, r, generator=gen, dtype=F64) * (
        torch.rand(n, r, generator=gen, dtype=F64) < 0.5
    )
    x = w @ h.T + 0.01 * torch.rand(d, n, generator=gen, dtype=F64) + 0.05 * (w @ h.T == 0)
    bases = torch.rand(1, d, r, generator=gen, dtype=F64)
    return x.reshape(1, d, 2, n // 2), bases / bases.norm(dim=1, keepdim=True)


def solve(
    layer: ih.Decomposition, x: Tensor, bases: Tensor, adjoint: ih.plugins.Adjoint
) -> ih.Solution:
    problem = layer.implicit_problem(x, init=bases)
    return problem.solve(ih.FixedPointIteration(max_steps=STEPS), adjoint)


def test_the_fixed_point_satisfies_the_kkt_conditions_of_the_regularised_loss() -> None:
    x, bases = sparse_input()
    layer = ih.RidgeNMF(rank=2, lam=0.1)
    sol = solve(layer, x, bases, ih.OneStep())
    state = tuple(t.detach().requires_grad_() for t in sol.value)
    loss = layer.objective(layer.flatten(x), state).sum()
    grads = torch.autograd.grad(loss, state)
    for z, g in zip(state, grads, strict=True):
        free = z.detach() > 0
        assert float(g[free].abs().max()) < 1e-10  # stationary on the free entries
        assert bool((g[~free] >= -1e-10).all())  # pushing into the constraint on the active ones
    assert any(bool((z.detach() == 0).any()) for z in state), "the case needs active constraints"


def test_ridge_removes_the_near_singularity_that_nmf_has_on_the_same_input() -> None:
    x, bases = sparse_input()
    x = x.requires_grad_()
    conds = {}
    for name, layer in (("ridge", ih.RidgeNMF(rank=2, lam=0.1)), ("nmf", ih.NMF(rank=2))):
        sol = solve(layer, x, bases, ih.Implicit(linear_solver="dense", cond_threshold=None))
        layer.readout(layer.flatten(x), sol.value).sum().backward()
        conds[name] = sol.backward_stats.cond
    assert conds["ridge"] < 1e3 < 1e5 < conds["nmf"], conds


def test_the_implicit_gradient_through_the_layer_matches_central_differences() -> None:
    x, bases = sparse_input()
    x = x.requires_grad_()
    layer = ih.RidgeNMF(rank=2, lam=0.1)
    sol = solve(
        layer, x, bases, ih.Implicit(linear_solver="dense", tol=1e-12, on_divergence="raise")
    )
    weights = torch.randn(8, 10, generator=torch.Generator().manual_seed(3), dtype=F64)

    def output(state: tuple[Tensor, ...]) -> Tensor:
        bases_, coef = state
        return (weights * (bases_ @ coef.mT)[0]).sum()  # the readout D C^T at the fixed point

    (grad,) = torch.autograd.grad(output(sol.value), x)
    direction = torch.randn(x.shape, generator=torch.Generator().manual_seed(4), dtype=F64)
    eps = 1e-6
    with torch.no_grad():
        up = output(solve(layer, x + eps * direction, bases, ih.OneStep()).value)
        down = output(solve(layer, x - eps * direction, bases, ih.OneStep()).value)
    fd = float(up - down) / (2 * eps)
    assert float((grad * direction).sum()) == pytest.approx(fd, rel=1e-6)
