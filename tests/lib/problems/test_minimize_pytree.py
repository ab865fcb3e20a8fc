"""``minimize`` / ``root`` over a dict of tensors and over a network's weights
(``module_state`` / ``call_module``): iMAML's proximal inner problem, its meta-gradient against
the closed form (linear model) and finite differences (an MLP), float64."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import implicit_ham as ih

F64 = torch.float64
EXACT = ih.Implicit(linear_solver="dense")


def sinusoid_tasks(tasks: int, shots: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Few-shot sinusoid regression: x (tasks, shots, 1) in [-5, 5], y = a sin(x + p)."""
    g = torch.Generator().manual_seed(seed)
    amplitude = 0.1 + 4.9 * torch.rand(tasks, 1, 1, generator=g, dtype=F64)
    phase = torch.pi * torch.rand(tasks, 1, 1, generator=g, dtype=F64)
    x = 10 * torch.rand(tasks, shots, 1, generator=g, dtype=F64) - 5
    return x, amplitude * torch.sin(x + phase)


def proximal(model: nn.Module, lam: float):
    """iMAML's inner problem, per task: mse(model_θ(x), y) + lam/2 ||θ - φ||², (B,)."""

    def loss(theta, phi, x, y):
        fit = ((ih.call_module(model, theta, x) - y) ** 2).mean(dim=(1, 2))
        prox = sum(((theta[k] - phi[k]) ** 2).flatten(1).sum(1) for k in theta)
        return fit + 0.5 * lam * prox

    return loss


def test_the_meta_gradient_of_a_linear_model_matches_the_closed_form() -> None:
    """Linear model θ = (w, b): the inner problem is quadratic, θ* = H^{-1}(2 Φ^T y / n + λ φ)
    with H = 2 Φ^T Φ / n + λ I (Φ = [x, 1]), and d outer / dφ = λ H^{-1} ∇_θ outer."""
    lam, tasks, shots = 0.5, 3, 10
    model = nn.Linear(1, 1).to(F64)
    x, y = sinusoid_tasks(tasks, shots)
    xq, yq = sinusoid_tasks(tasks, shots, seed=1)
    phi = {k: v[0].clone().requires_grad_() for k, v in ih.module_state(model).items()}
    theta0 = ih.module_state(model, batch=tasks)
    sol = ih.minimize(proximal(model, lam), theta0, phi, x, y, adjoint=EXACT)
    outer = ((ih.call_module(model, sol.value, xq) - yq) ** 2).mean()
    grads = torch.autograd.grad(outer, [phi["weight"], phi["bias"]])

    features = torch.cat([x, torch.ones_like(x)], dim=2)  # (tasks, shots, 2)
    H = 2 * features.transpose(1, 2) @ features / shots + lam * torch.eye(2, dtype=F64)
    p = torch.cat([phi["weight"].detach().reshape(-1), phi["bias"].detach()])
    rhs = 2 * features.transpose(1, 2) @ y / shots + lam * p[:, None]
    theta_ref = torch.linalg.solve(H, rhs)[..., 0]  # (tasks, 2)
    assert torch.allclose(sol.value["weight"].reshape(tasks), theta_ref[:, 0], atol=1e-9)
    assert torch.allclose(sol.value["bias"].reshape(tasks), theta_ref[:, 1], atol=1e-9)
    fq = torch.cat([xq, torch.ones_like(xq)], dim=2)
    resid = (fq @ theta_ref[..., None]) - yq
    outer_grad = 2 * fq.transpose(1, 2) @ resid / resid.numel()  # (tasks, 2, 1)
    meta_ref = (lam * torch.linalg.solve(H, outer_grad))[..., 0].sum(0)
    assert torch.allclose(torch.cat([grads[0].reshape(-1), grads[1]]), meta_ref, atol=1e-9)


def test_the_meta_gradient_through_an_mlp_matches_finite_differences() -> None:
    torch.manual_seed(0)
    lam, tasks, shots = 2.0, 2, 8
    model = nn.Sequential(nn.Linear(1, 8), nn.Tanh(), nn.Linear(8, 1)).to(F64)
    x, y = sinusoid_tasks(tasks, shots, seed=2)
    xq, yq = sinusoid_tasks(tasks, shots, seed=3)
    solver = ih.LBFGS(tol=1e-12, max_steps=500)

    def meta_loss(phi: dict[str, torch.Tensor]) -> torch.Tensor:
        theta0 = {k: v.detach().expand(tasks, *v.shape).clone() for k, v in phi.items()}
        sol = ih.minimize(proximal(model, lam), theta0, phi, x, y, solver=solver,
                          adjoint=EXACT)  # fmt: skip
        return ((ih.call_module(model, sol.value, xq) - yq) ** 2).mean()

    phi = {k: v[0].clone().requires_grad_() for k, v in ih.module_state(model).items()}
    grads = torch.autograd.grad(meta_loss(phi), list(phi.values()))
    g = torch.Generator().manual_seed(4)
    for _ in range(2):
        direction = {k: torch.randn(v.shape, generator=g, dtype=F64) for k, v in phi.items()}
        h = 1e-5
        with torch.no_grad():
            plus = meta_loss({k: phi[k] + h * direction[k] for k in phi})
            minus = meta_loss({k: phi[k] - h * direction[k] for k in phi})
        fd = float(plus - minus) / (2 * h)
        analytic = sum(float((gr * direction[k]).sum()) for gr, k in zip(grads, phi, strict=True))
        assert abs(fd - analytic) <= 1e-6 * max(1.0, abs(fd))


def test_root_takes_and_returns_a_dict() -> None:
    A = torch.tensor([[3.0, 1.0], [1.0, 2.0]], dtype=F64)
    b = torch.tensor([[1.0, -1.0]], dtype=F64, requires_grad=True)

    def g(z, b):
        return {"u": z["u"] @ A - b, "v": 2 * z["v"] - 1}

    z0 = {"u": torch.zeros(1, 2, dtype=F64), "v": torch.zeros(1, 3, dtype=F64)}
    sol = ih.root(g, z0, b)
    assert set(sol.value) == {"u", "v"}
    assert torch.allclose(sol.value["u"], b.detach() @ torch.linalg.inv(A), atol=1e-9)
    (grad,) = torch.autograd.grad(sol.value["u"].sum(), b)
    assert torch.allclose(grad, torch.linalg.inv(A).sum(1)[None], atol=1e-9)


def test_pytree_leaves_with_different_batch_sizes_are_refused_by_name() -> None:
    z0 = {"w": torch.zeros(2, 3), "b": torch.zeros(3)}
    with pytest.raises(ValueError, match=r"different batch sizes.*z0\['w'\]: 2.*z0\['b'\]: 3"):
        ih.minimize(lambda z: (z["w"] ** 2).sum(), z0)


def test_module_helpers_refuse_bad_input() -> None:
    model = nn.Linear(2, 1)
    with pytest.raises(ValueError, match="has no parameters"):
        ih.module_state(nn.Tanh())
    with pytest.raises(ValueError, match="batch must be a positive int"):
        ih.module_state(model, batch=0)
    with pytest.raises(ValueError, match=r"\['nope'\] are not parameters"):
        ih.call_module(model, {"nope": torch.zeros(1, 2)}, torch.zeros(1, 4, 2))
    with pytest.raises(ValueError, match=r"expected \(B, 1, 2\)"):
        ih.call_module(model, {"weight": torch.zeros(2, 1)}, torch.zeros(1, 4, 2))
    with pytest.raises(TypeError, match="leaf z0\\['w'\\] is a scalar"):
        ih.minimize(lambda z: z["w"] ** 2, {"w": torch.tensor(1.0)})
