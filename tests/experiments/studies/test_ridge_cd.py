"""``RidgeCD``: CD posed as the argmin of a ridge-regularised objective (issue 18, item 4).

References independent of the layer: ``psi`` below re-implements the objective from its formula
(``F.normalize``, ``logsumexp``); its autograd gradient and ``torch.func.hessian`` give the
stationarity, the gradient step and the Hessian; central differences of the converged layer
check the implicit gradient. The full conditioning measurement is
experiments/studies/ridge_conditioning/cd.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

import implicit_ham as ih
from implicit_ham.testing import check_decomposition

F64 = torch.float64
INV_T = 100.0


def psi(x: Tensor, bases: Tensor, lam: float, inv_t: float = INV_T) -> Tensor:
    """The objective from its formula, for X (d, n) and D (d, r): ``-(1 / inv_t) sum_j w_j
    logsumexp_k(inv_t (xh_j^T d_k - lam / 2 ||d_k||^2))``, ``w_j = ||x_j|| / sum_i ||x_i||``."""
    norms = x.norm(dim=0)
    logits = inv_t * (F.normalize(x, dim=0).T @ bases - 0.5 * lam * bases.square().sum(dim=0))
    return -(norms / norms.sum() * torch.logsumexp(logits, dim=1)).sum() / inv_t


def masses(x: Tensor, bases: Tensor, lam: float, inv_t: float = INV_T) -> Tensor:
    """(r,): ``pi_k = sum_j c_jk ||x_j|| / sum_i ||x_i||`` with C from the logits of ``psi``."""
    norms = x.norm(dim=0)
    logits = inv_t * (F.normalize(x, dim=0).T @ bases - 0.5 * lam * bases.square().sum(dim=0))
    return (torch.softmax(logits, dim=1) * norms[:, None]).sum(dim=0) / norms.sum()


def clustered_input(d: int = 6, n: int = 12, r: int = 2, seed: int = 0) -> tuple[Tensor, Tensor]:
    """x (1, d, 3, n/3): r noisy clusters of pixels with norms in [0.5, 2); initial unit bases
    (1, d, r)."""
    gen = torch.Generator().manual_seed(seed)
    centres = F.normalize(torch.randn(d, r, generator=gen, dtype=F64), dim=0)
    x = centres[:, torch.arange(n) % r] + 0.3 * torch.randn(d, n, generator=gen, dtype=F64)
    x = F.normalize(x, dim=0) * (0.5 + 1.5 * torch.rand(n, generator=gen, dtype=F64))
    bases = F.normalize(torch.randn(1, d, r, generator=gen, dtype=F64), dim=1)
    return x.reshape(1, d, 3, n // 3), bases


def converged(
    layer: ih.RidgeCD, x: Tensor, bases: Tensor, adjoint: ih.plugins.Adjoint
) -> ih.Solution:
    problem = layer.implicit_problem(x, init=bases)
    return problem.solve(ih.FixedPointIteration(max_steps=300), adjoint)


def test_one_iteration_is_a_mass_preconditioned_gradient_step_on_the_objective() -> None:
    """``d_k <- d_k - grad_k Psi / (lam pi_k)`` (with ``eps`` -> 0)."""
    x, _ = clustered_input()
    layer = ih.RidgeCD(rank=2, lam=0.7, eps=1e-300)
    flat = layer.flatten(x)
    bases = torch.randn(1, 6, 2, generator=torch.Generator().manual_seed(1), dtype=F64)
    bases.requires_grad_()
    (grad,) = torch.autograd.grad(psi(flat[0], bases[0], lam=0.7), bases)
    scale = 0.7 * masses(flat[0], bases[0].detach(), lam=0.7)
    new_bases, coef = layer.step(flat, (bases.detach(), torch.zeros(1, 12, 2, dtype=F64)))
    torch.testing.assert_close(new_bases, bases.detach() - grad / scale, rtol=1e-12, atol=1e-12)
    logits = F.normalize(flat[0], dim=0).T @ bases[0].detach()
    logits = INV_T * (logits - 0.35 * bases[0].detach().square().sum(dim=0))
    torch.testing.assert_close(coef[0], torch.softmax(logits, dim=1))
    objective = float(layer.objective(flat, (bases.detach(), coef))[0])
    assert objective == pytest.approx(float(psi(flat[0], bases[0].detach(), lam=0.7)), rel=1e-12)


def test_the_fixed_point_is_a_minimum_of_the_objective() -> None:
    x, bases = clustered_input()
    layer = ih.RidgeCD(rank=2, lam=1.0, eps=1e-300)
    sol = converged(layer, x, bases, ih.OneStep())
    assert float(sol.stats.rel_residual.max()) < 1e-14
    d_star = sol.value[0][0].detach().requires_grad_()
    flat = layer.flatten(x)[0]
    (grad,) = torch.autograd.grad(psi(flat, d_star, lam=1.0), d_star)
    assert float(grad.abs().max()) < 1e-12  # stationary
    hessian = torch.func.hessian(lambda d: psi(flat, d.reshape(6, 2), lam=1.0))(
        d_star.detach().reshape(-1)
    )
    assert float(torch.linalg.eigvalsh(hessian)[0]) > 1e-3  # positive definite: a minimum
    # and L-BFGS on the independent objective, started there, stays there
    lbfgs = ih.minimize(
        lambda d: psi(flat, d.reshape(6, 2), lam=1.0),
        d_star.detach().reshape(1, -1) + 1e-4,
        solver=ih.LBFGS(tol=1e-12),
    )
    torch.testing.assert_close(lbfgs.value.reshape(6, 2), d_star.detach(), rtol=0, atol=1e-9)


def test_i_minus_j_of_the_concept_block_is_the_preconditioned_hessian() -> None:
    """At the fixed point ``I - dD'/dD = P^-1 H``, ``P = lam diag(pi_k)`` per concept."""
    x, bases = clustered_input()
    layer = ih.RidgeCD(rank=2, lam=1.5, eps=1e-300)
    sol = converged(layer, x, bases, ih.OneStep())
    flat = layer.flatten(x)
    d_star = sol.value[0].detach()
    jac = torch.func.jacrev(lambda d: layer.step(flat, (d, sol.value[1]))[0])(d_star)
    hessian = torch.func.hessian(lambda d: psi(flat[0], d, lam=1.5))(d_star[0]).reshape(12, 12)
    precondition = (1.5 * masses(flat[0], d_star[0], lam=1.5)).repeat(6)  # (d, r) row-major
    i_minus_a = torch.eye(12, dtype=F64) - jac.reshape(12, 12)
    torch.testing.assert_close(i_minus_a, hessian / precondition[:, None], rtol=0, atol=1e-10)


def test_cd_fixed_points_are_stationary_points_of_the_objective_on_the_unit_spheres() -> None:
    """The relation to CD stated in the module: the tangential gradient of Psi vanishes at CD's
    fixed point (lam only adds a radial term on the spheres)."""
    x, bases = clustered_input()
    cd = ih.CD(rank=2)
    sol = cd.implicit_problem(x, init=bases).solve(
        ih.FixedPointIteration(max_steps=300), ih.OneStep()
    )
    d_cd = sol.value[0][0].detach().requires_grad_()
    assert torch.allclose(d_cd.norm(dim=0), torch.ones(2, dtype=F64))
    (grad,) = torch.autograd.grad(psi(cd.flatten(x)[0], d_cd, lam=1.0), d_cd)
    tangential = grad - d_cd.detach() * (d_cd.detach() * grad).sum(dim=0)
    assert float(tangential.abs().max()) < 1e-12 < float(grad.abs().max())


def test_the_implicit_gradient_matches_central_differences_of_the_minimum() -> None:
    x, bases = clustered_input()
    x = x.requires_grad_()
    layer = ih.RidgeCD(rank=2, lam=1.0, eps=1e-300)
    weights = torch.randn(6, 12, generator=torch.Generator().manual_seed(3), dtype=F64)

    def output(xx: Tensor, adjoint: ih.plugins.Adjoint) -> Tensor:
        sol = converged(layer, xx, bases, adjoint)
        return (weights * layer.readout(layer.flatten(xx), sol.value)[0]).sum()

    implicit = ih.Implicit(linear_solver="dense", tol=1e-12, on_divergence="raise")
    (grad,) = torch.autograd.grad(output(x, implicit), x)
    direction = torch.randn(x.shape, generator=torch.Generator().manual_seed(4), dtype=F64)
    eps = 1e-6
    with torch.no_grad():
        up = output(x + eps * direction, ih.OneStep())
        down = output(x - eps * direction, ih.OneStep())
    fd = float(up - down) / (2 * eps)
    assert float((grad * direction).sum()) == pytest.approx(fd, rel=1e-6)


def test_the_forward_value_is_the_same_under_every_backward_mode() -> None:
    x, bases = clustered_input()
    layer = ih.RidgeCD(rank=2, steps=6)
    outputs = []
    for adjoint in (ih.OneStep(), ih.Unroll(), ih.Implicit(), ih.Phantom(k=2, tau=0.5)):
        layer.adjoint = adjoint
        outputs.append(layer(x, init=bases))
    assert all(torch.equal(outputs[0], y) for y in outputs[1:])


def test_a_configured_layer_passes_the_conformance_kit() -> None:
    """(The registered class with its defaults is checked by test_testing_kit.py.)"""
    report = check_decomposition(ih.RidgeCD(rank=2, steps=3, eval_steps=3, lam=0.5, groups=2))
    assert report.ok and "lam=0.5" in report.plugin


def test_a_non_positive_ridge_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="lam"):
        ih.RidgeCD(rank=2, lam=0.0)


def test_the_sweep_arms_compose_and_build_the_ham() -> None:
    """``context=cd_ridge`` and the arms ``cd_ridge_{implicit,one_step,unroll}`` build a
    shape-preserving block with the experiments' rank."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from experiments.config.groups import register_configs
    from experiments.engine.build import build_context

    register_configs()
    conf = str(Path(__file__).resolve().parents[3] / "conf")
    for arm in ("cd_ridge_implicit", "cd_ridge_one_step", "cd_ridge_unroll"):
        with initialize_config_dir(config_dir=conf, version_base="1.3"):
            cfg = compose("config", overrides=[f"+arm={arm}", "context.lam=0.5"])
        assert cfg.context.rank == 8
        adjoint = ih.plugins.make_adjoint(arm.removeprefix("cd_ridge_"))
        block = build_context(
            OmegaConf.to_object(cfg.context), 16, ih.FixedPointIteration(), adjoint
        )
        x = torch.randn(2, 16, 8, 8)
        assert block(x).shape == x.shape
        assert any(isinstance(m, ih.RidgeCD) and m.lam == 0.5 for m in block.modules())
