"""Second derivatives (design.md: "a mode that cannot give a second derivative refuses
``create_graph=True`` instead of returning a wrong one").

The at-fixed-point modes (Implicit, Neumann) differentiate ``f`` once at z* with a fixed adjoint
vector; a second derivative through them would hold z* and the adjoint vector constant and be
wrong (it was: 30-100% off, silently, under ``torch.autograd.grad(..., inputs=...)``, which
prunes the error node ``once_differentiable`` relies on). They refuse instead; Unroll gives the
exact second derivative of the K-step computation.
"""

from __future__ import annotations

import pytest
import torch

import implicit_ham as ih

SOLVER = ih.FixedPointIteration(max_steps=60)


@pytest.mark.parametrize(
    "adjoint", [ih.Implicit(), ih.Implicit(linear_solver="dense"), ih.Neumann()], ids=repr
)
@pytest.mark.parametrize("nonlinear_loss", [False, True])
def test_at_fixed_point_modes_refuse_create_graph(tanh_problem, adjoint, nonlinear_loss) -> None:
    p = tanh_problem(batch=2, width=4)
    sol = ih.fixed_point(p.f, p.z0, *p.args, solver=SOLVER, adjoint=adjoint)
    loss = (sol.value**2).sum() if nonlinear_loss else sol.value.sum()
    with pytest.raises(ih.SecondOrderError, match="create_graph=True"):
        torch.autograd.grad(loss, p.args, create_graph=True)


def test_at_fixed_point_modes_still_give_first_derivatives(tanh_problem) -> None:
    p = tanh_problem(batch=2, width=4)
    sol = ih.fixed_point(p.f, p.z0, *p.args, solver=SOLVER, adjoint=ih.Implicit())
    grads = torch.autograd.grad((sol.value**2).sum(), p.args, retain_graph=True)
    again = torch.autograd.grad((sol.value**2).sum(), p.args)
    assert all(torch.equal(a, b) and bool(a.any()) for a, b in zip(grads, again, strict=True))


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
