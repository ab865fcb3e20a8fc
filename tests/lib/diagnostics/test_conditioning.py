"""Conditioning diagnostics against known answers: prescribed eigenvalues, prescribed singular
values, a dense Jacobian of NMF's map, and exact contraction factors."""

from __future__ import annotations

import dataclasses
import math
import warnings

import pytest
import torch

import implicit_ham as ih
from implicit_ham.diagnostics import (
    FixedPointJacobian,
    check_conditioning,
    contraction_factors,
    contraction_rate,
    estimate_conditioning,
    warn_if_ill_conditioned,
)

F64 = torch.float64


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _orthogonal(m: int, gen: torch.Generator) -> torch.Tensor:
    return torch.linalg.qr(torch.randn(m, m, dtype=F64, generator=gen))[0]


def _similar(block: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Q block Q^-1 with a non-orthogonal Q: a non-symmetric matrix with block's eigenvalues."""
    m = block.shape[0]
    scales = torch.rand(m, dtype=F64, generator=gen) * 1.5 + 0.5
    q = _orthogonal(m, gen) @ torch.diag(scales) @ _orthogonal(m, gen)
    return q @ block @ torch.linalg.inv(q)


def _linear_map(a: torch.Tensor):
    return lambda z, b: z @ a.T + b


def _fixed_point_of(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    eye = torch.eye(a.shape[0], dtype=F64)
    return torch.linalg.solve(eye - a, b.T).T


def test_spectral_radius_real_dominant_eigenvalue() -> None:
    gen = _gen(0)
    m = 80
    lam = torch.cat([torch.tensor([-0.93], dtype=F64), torch.rand(m - 1, dtype=F64, generator=gen)])
    lam[1:] = lam[1:] * 1.4 - 0.7
    a = _similar(torch.diag(lam), gen)
    assert not torch.allclose(a, a.T)
    b = torch.randn(1, m, dtype=F64, generator=gen)
    report = estimate_conditioning(_linear_map(a), _fixed_point_of(a, b), b)
    assert report.spectral_radius == pytest.approx(0.93, rel=0.01)
    assert report.fixed_point_residual < 1e-10


def test_spectral_radius_complex_pair_and_batch_block_diagonal() -> None:
    gen = _gen(1)
    m = 60
    block = torch.diag(torch.rand(m, dtype=F64, generator=gen) * 1.2 - 0.6)
    block[:2, :2] = torch.tensor([[0.5, -0.7], [0.7, 0.5]], dtype=F64)  # 0.5 ± 0.7i
    a = _similar(block, gen)
    b = torch.randn(3, m, dtype=F64, generator=gen)  # B = 3 samples: J is block diagonal
    report = estimate_conditioning(_linear_map(a), _fixed_point_of(a, b), b)
    assert report.size == 3 * m
    assert report.spectral_radius == pytest.approx(math.hypot(0.5, 0.7), rel=0.01)


def _prescribed_singular_values(u: torch.Tensor, s: torch.Tensor, v: torch.Tensor):
    """f(z) = J z with I - J = U diag(s) V^T."""
    jac = torch.eye(s.numel(), dtype=F64) - u @ torch.diag(s) @ v.T
    return lambda z: z @ jac.T


def test_kappa_of_prescribed_singular_values_non_normal() -> None:
    gen = _gen(2)
    m = 60
    s = torch.logspace(math.log10(2.0), math.log10(2e-3), m, dtype=F64)
    f = _prescribed_singular_values(_orthogonal(m, gen), s, _orthogonal(m, gen))
    report = estimate_conditioning(
        f, torch.zeros(1, m, dtype=F64), lanczos_steps=15, inverse_steps=8, inner_steps=m + 20
    )
    assert report.sigma_max == pytest.approx(2.0, rel=0.01)
    assert report.kappa == pytest.approx(1000.0, rel=0.1)
    # the estimate is a lower bound of κ (both singular values are attained by vectors)
    assert report.kappa <= 1000.0 * (1 + 1e-6)


def test_kappa_of_isolated_small_singular_value_default_settings() -> None:
    gen = _gen(3)
    m = 300
    u = _orthogonal(m, gen)
    skew = torch.randn(m, m, dtype=F64, generator=gen) * 0.3 / math.sqrt(m)
    v = u @ torch.linalg.matrix_exp(skew - skew.T)  # nearly normal: a DEQ-like I - J
    s = torch.cat([torch.rand(m - 1, dtype=F64, generator=gen) * 1.9 + 0.1, torch.tensor([1e-4])])
    s = s.to(F64)
    report = estimate_conditioning(
        _prescribed_singular_values(u, s, v), torch.zeros(1, m, dtype=F64)
    )
    assert report.kappa == pytest.approx(float(s.max() / s.min()), rel=0.1)


def test_check_conditioning_warns_with_numbers_only_when_ill_conditioned() -> None:
    gen = _gen(4)
    m = 30
    u, v = _orthogonal(m, gen), _orthogonal(m, gen)
    singular = torch.cat(
        [torch.linspace(1.0, 0.5, m - 1, dtype=F64), torch.tensor([1e-8], dtype=F64)]
    )
    bad = ih.FixedPointProblem(
        _prescribed_singular_values(u, singular, v), torch.zeros(1, m, dtype=F64)
    )
    with pytest.warns(ih.ConditioningWarning, match=r"κ\(I - J\) >= 1\.0\d*e\+08"):
        report = check_conditioning(bad, threshold=1e6, z_star=torch.zeros(1, m, dtype=F64))
    assert report.kappa == pytest.approx(1e8, rel=0.1)
    good = torch.linspace(1.0, 0.1, m, dtype=F64)
    fine = ih.FixedPointProblem(
        _prescribed_singular_values(u, good, v), torch.zeros(1, m, dtype=F64)
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error", ih.ConditioningWarning)
        report = check_conditioning(fine, threshold=1e6, solver=ih.FixedPointIteration(max_steps=2))
    assert report.kappa == pytest.approx(10.0, rel=0.1)
    assert not warn_if_ill_conditioned(report, threshold=1e6)


def test_ill_conditioning_warning_text_and_location() -> None:
    """The message users see (docs/diagnostics.md quotes it) with the report's numbers, and
    the warning points at the line that asked for the check."""
    report = ih.diagnostics.ConditioningReport(
        size=4,
        spectral_radius=1.0,
        spectral_radius_residual=0.0,
        sigma_max=1.428,
        sigma_min=2.121e-08,
        kappa=6.733e07,
        fixed_point_residual=5.922e-08,
        products=10,
        backend="func",
    )
    with pytest.warns(ih.ConditioningWarning) as caught:
        assert warn_if_ill_conditioned(report, threshold=1e6, where="layer")
    (warning,) = caught
    assert str(warning.message) == (
        "layer: κ(I - J) >= 6.733e+07 exceeds 1.0e+06 (sigma_max 1.428e+00, sigma_min <= "
        "2.121e-08, spectral radius of J 1.0000, fixed-point residual 5.92e-08); implicit "
        "gradients (I - J)^-T v are unreliable here. A continuum of fixed points (e.g. NMF's "
        "scaling symmetry) causes this: use OneStep, Phantom or Unroll, or regularise the map. "
        "Unknowns whose sizes differ by orders of magnitude (e.g. a curve fit's amplitude and "
        "rate) also raise κ: rescale them so that they are of order one."
    )
    assert warning.filename == __file__
    nan_report = dataclasses.replace(report, kappa=math.nan)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ih.ConditioningWarning)
        assert not warn_if_ill_conditioned(nan_report, threshold=1e6)


def _nmf_step(z: tuple[torch.Tensor, torch.Tensor], x: torch.Tensor):
    """Multiplicative NMF updates (Lee & Seung), the map of Hamburger's NMF ham."""
    d, c = z
    c = c * (x.transpose(1, 2) @ d) / (c @ (d.transpose(1, 2) @ d) + 1e-6)
    d = d * (x @ c) / (d @ (c.transpose(1, 2) @ c) + 1e-6)
    return d, c


def test_nmf_scaling_symmetry_is_detected_and_matches_dense_jacobian() -> None:
    gen = _gen(5)
    dim, n, r = 8, 12, 2
    x = torch.rand(1, dim, n, dtype=F64, generator=gen)
    z0 = (
        torch.rand(1, dim, r, dtype=F64, generator=gen),
        torch.rand(1, n, r, dtype=F64, generator=gen),
    )
    problem = ih.FixedPointProblem(_nmf_step, z0, (x,))
    with pytest.warns(ih.ConditioningWarning, match="NMF"):
        report = check_conditioning(problem, solver=ih.FixedPointIteration(max_steps=2000))

    with torch.no_grad():
        z = problem.solve(ih.FixedPointIteration(max_steps=2000)).value
    flat = torch.cat([t.reshape(-1) for t in z])

    def flat_map(vec: torch.Tensor) -> torch.Tensor:
        d, c = vec[: dim * r].reshape(1, dim, r), vec[dim * r :].reshape(1, n, r)
        return torch.cat([t.reshape(-1) for t in _nmf_step((d, c), x)])

    jac = torch.autograd.functional.jacobian(flat_map, flat)
    true_kappa = float(torch.linalg.cond(torch.eye(flat.numel(), dtype=F64) - jac))
    assert true_kappa > 1e6
    assert report.kappa == pytest.approx(true_kappa, rel=0.1)
    assert report.spectral_radius == pytest.approx(1.0, rel=0.01)


@pytest.mark.parametrize("backend", ["func", "autograd"])
def test_jacobian_products_match_dense_jacobian(backend: str) -> None:
    gen = _gen(6)
    w = torch.randn(5, 5, dtype=F64, generator=gen) * 0.4
    x = torch.randn(2, 5, dtype=F64, generator=gen)
    z = torch.randn(2, 5, dtype=F64, generator=gen)

    def f(z: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(z @ w.T + x) * z.sum(dim=0, keepdim=True)  # couples the samples

    jac = FixedPointJacobian(f, z, x, backend=backend)
    assert jac.backend == backend
    dense = torch.autograd.functional.jacobian(
        lambda v: f(v.reshape(2, 5), x).reshape(-1), z.reshape(-1)
    )
    v = torch.randn(10, dtype=F64, generator=gen)
    torch.testing.assert_close(jac.jvp(v), dense @ v)
    torch.testing.assert_close(jac.vjp(v), dense.T @ v)


def test_contraction_factors_of_a_scalar_linear_iteration() -> None:
    a = torch.tensor([0.5, -0.8], dtype=F64)
    problem = ih.FixedPointProblem(lambda z: a * z + 1.0, torch.zeros(2, dtype=F64))
    sol = problem.solve(ih.FixedPointIteration(max_steps=12, trace=True))
    factors = contraction_factors(sol.stats.residuals)
    assert factors.shape == (11, 2)
    torch.testing.assert_close(factors, a.abs().expand(11, 2))
    torch.testing.assert_close(contraction_rate(sol.stats.residuals), a.abs())


def test_contraction_factors_reject_a_flat_trace() -> None:
    with pytest.raises(ValueError, match=r"\(steps, B\)"):
        contraction_factors(torch.ones(5))


class _OldStyleTanh(torch.autograd.Function):
    """tanh as an old-style autograd.Function (no setup_context): torch.func rejects it."""

    @staticmethod
    def forward(ctx, x):  # type: ignore[override]
        y = torch.tanh(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        (y,) = ctx.saved_tensors
        return grad * (1 - y * y)


def test_auto_backend_falls_back_to_autograd_when_torch_func_cannot_transform_f() -> None:
    gen = _gen(7)
    w = torch.randn(4, 4, dtype=F64, generator=gen) * 0.5
    z = torch.randn(1, 4, dtype=F64, generator=gen)

    def f(z: torch.Tensor) -> torch.Tensor:
        return _OldStyleTanh.apply(z @ w.T)

    jac = FixedPointJacobian(f, z)
    assert jac.backend == "autograd"
    dense = torch.diag(1 - torch.tanh(z @ w.T)[0] ** 2) @ w  # d tanh(W z) / dz
    v = torch.randn(4, dtype=F64, generator=gen)
    torch.testing.assert_close(jac.jvp(v), dense @ v)
    torch.testing.assert_close(jac.vjp(v), dense.T @ v)
    with pytest.raises(RuntimeError, match="backend='autograd'"):
        FixedPointJacobian(f, z, backend="func")
