"""Conditioning of a fixed point: spectral radius of J = df/dz, singular values and condition
number of I - J, and the empirical contraction of a forward solve.

What is computed (all matrix-free, on the whole batch's flattened state, M = B * N):

* ``spectral_radius``: |Ritz value| of largest modulus of J by restarted Arnoldi on JVPs
  (``krylov.arnoldi_dominant``); ``spectral_radius_residual`` is the Ritz residual
  ``||J x - θ x||`` of its unit Ritz vector, an accuracy indicator.
* ``sigma_max``: sqrt of the largest Lanczos Ritz value of ``(I - J)^T (I - J)`` (one JVP and
  one VJP per step); a lower bound of the true value that converges in a few dozen steps.
* ``sigma_min``: ``min ||(I - J) x||`` over unit vectors x produced by Lanczos (its smallest
  Ritz vector) and then by inverse iteration on the normal operator, each inverse step being two
  GMRES solves (``(I - J)^T w = x``, ``(I - J) y = w``). Every candidate is an actual vector,
  so this is an upper bound of the true sigma_min; inverse iteration makes it tight when the
  smallest singular value is well separated.
* ``kappa = sigma_max / sigma_min``: therefore a lower bound of the true condition number. A
  large value is conclusive (I - J is at least that ill-conditioned); a moderate one is
  accurate to the tolerances above (tests check 10% on prescribed singular values).
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor

from implicit_ham._core.caller import user_stacklevel
from implicit_ham._core.errors import NotFixedPointWarning
from implicit_ham._core.ill_conditioning import warn_ill_conditioned
from implicit_ham.diagnostics.jacobian import FixedPointJacobian
from implicit_ham.linalg.krylov import GMRES, arnoldi_dominant, lanczos_extremes
from implicit_ham.linalg.operator import AdjointOperator
from implicit_ham.problems.fixed_point import FixedPointProblem
from implicit_ham.solvers.base import FixedPointSolver
from implicit_ham.solvers.iteration import FixedPointIteration

logger = logging.getLogger(__name__)

CONVERGED_SOLVER = FixedPointIteration(max_steps=1000, tol=1e-8)


@dataclass(frozen=True)
class ConditioningReport:
    """Conditioning numbers of ``I - J`` at a point (see the module docstring for the method).

    Attributes:
        size: M, entries of the whole batch's state.
        spectral_radius: estimate of max |eigenvalue of J|.
        spectral_radius_residual: Ritz residual of that estimate.
        sigma_max: estimate (lower bound) of the largest singular value of I - J.
        sigma_min: estimate (upper bound) of the smallest singular value of I - J.
        kappa: sigma_max / sigma_min (a lower bound of κ(I - J); inf if sigma_min == 0).
        fixed_point_residual: ``||f(z) - z|| / ||z||`` at the point; large means the point is
            not a fixed point and the numbers describe J there, not at z*.
        products: JVPs + VJPs spent.
        backend: "func" or "autograd" (see ``FixedPointJacobian``).
    """

    size: int
    spectral_radius: float
    spectral_radius_residual: float
    sigma_max: float
    sigma_min: float
    kappa: float
    fixed_point_residual: float
    products: int
    backend: str

    def as_dict(self, prefix: str = "") -> dict[str, float | int | str]:
        """The fields as a flat dict, keys prefixed with ``prefix`` (e.g. "cond/layer1/")."""
        return {prefix + k: v for k, v in asdict(self).items()}


def estimate_conditioning(
    f: Callable[..., Any],
    z_star: Tensor | Sequence[Tensor],
    *args: Any,
    backend: str = "auto",
    **options: Any,
) -> ConditioningReport:
    """Conditioning of ``I - J`` with ``J = df/dz`` at ``z_star`` (usable from a callback).

    Args:
        f: ``f(z, *args) -> z'``. z_star: the point, a Tensor (B, ...) or tuple of them.
        *args: the other inputs of ``f`` (held constant).
        backend: "auto", "func" or "autograd" (see ``FixedPointJacobian``).
        **options: the keyword options of ``conditioning_of``:
        krylov_dim, restarts: Arnoldi dimension and restarts for the spectral radius.
        lanczos_steps: Lanczos steps on ``(I - J)^T (I - J)``.
        inverse_steps: inverse-iteration steps refining sigma_min (0 to skip).
        inner_steps, inner_tol: GMRES budget (products) and relative tolerance per solve
            (default: sqrt of the dtype's machine epsilon, 1.5e-8 in float64, 3.5e-4 in
            float32; the Arnoldi stopping tolerance is max(1e-4, the same)).
        seed: seed of the random start vectors (a private generator; global RNG untouched).

    Cost: about ``krylov_dim * (restarts + 1) + 2 * lanczos_steps + 2 * inverse_steps *
    inner_steps`` products at most, each comparable to one evaluation of ``f``.
    """
    return conditioning_of(FixedPointJacobian(f, z_star, *args, backend=backend), **options)


def conditioning_of(
    jac: FixedPointJacobian,
    *,
    krylov_dim: int = 30,
    restarts: int = 3,
    lanczos_steps: int = 30,
    inverse_steps: int = 2,
    inner_steps: int = 100,
    inner_tol: float | None = None,
    seed: int = 0,
) -> ConditioningReport:
    """``estimate_conditioning`` on an existing ``FixedPointJacobian`` (its options documented
    there); an unknown option is a TypeError naming it."""
    z = jac.z_star
    gen = torch.Generator(device=z.device).manual_seed(seed)
    start = torch.randn(z.shape, generator=gen, device=z.device, dtype=z.dtype)
    precision = math.sqrt(torch.finfo(z.dtype).eps)
    inner_tol = precision if inner_tol is None else inner_tol
    ritz = arnoldi_dominant(
        jac.jvp, start, dim=krylov_dim, restarts=restarts, rtol=max(1e-4, precision)
    )

    def a_mv(x: Tensor) -> Tensor:
        return x - jac.jvp(x)

    def normal_mv(x: Tensor) -> Tensor:
        y = a_mv(x)
        return y - jac.vjp(y)

    lanczos = lanczos_extremes(normal_mv, start, steps=lanczos_steps)
    sigma_max = math.sqrt(max(lanczos.largest, 0.0))
    sigma_min = _refine_sigma_min(
        jac, a_mv, lanczos.smallest_vector, inverse_steps, inner_steps, inner_tol
    )
    kappa = sigma_max / sigma_min if sigma_min > 0 else math.inf
    return ConditioningReport(
        size=jac.size,
        spectral_radius=abs(ritz.value),
        spectral_radius_residual=ritz.residual,
        sigma_max=sigma_max,
        sigma_min=sigma_min,
        kappa=kappa,
        fixed_point_residual=jac.residual(),
        products=jac.calls,
        backend=jac.backend,
    )


def _refine_sigma_min(
    jac: FixedPointJacobian,
    a_mv: Callable[[Tensor], Tensor],
    x: Tensor,
    steps: int,
    inner_steps: int,
    inner_tol: float,
) -> float:
    """``min ||(I - J) x||`` over the Lanczos vector and ``steps`` inverse-iteration vectors."""
    x = x / torch.linalg.vector_norm(x)
    best = float(torch.linalg.vector_norm(a_mv(x)))
    gmres = GMRES(restart=inner_steps)
    solve_t = AdjointOperator(jac.vjp, _rowwise(jac.vjp), jac.size)
    solve_n = AdjointOperator(jac.jvp, _rowwise(jac.jvp), jac.size)
    for _ in range(steps):
        w, _, _ = gmres.solve(solve_t, x, inner_steps, inner_tol)
        y, _, _ = gmres.solve(solve_n, w, inner_steps, inner_tol)
        norm = float(torch.linalg.vector_norm(y))
        if not math.isfinite(norm) or norm == 0.0:
            break
        x = y / norm
        best = min(best, float(torch.linalg.vector_norm(a_mv(x))))
    return best


def _rowwise(mv: Callable[[Tensor], Tensor]) -> Callable[[Tensor], Tensor]:
    return lambda rows: torch.stack([mv(r) for r in rows])


def warn_if_ill_conditioned(
    report: ConditioningReport, threshold: float = 1e6, where: str = "fixed point"
) -> bool:
    """Warn ``ConditioningWarning`` (with the numbers) when ``report.kappa > threshold``.

    Returns whether it warned.
    """
    evidence = (
        f"sigma_max {report.sigma_max:.3e}, sigma_min <= {report.sigma_min:.3e}, spectral "
        f"radius of J {report.spectral_radius:.4f}, fixed-point residual "
        f"{report.fixed_point_residual:.2e}"
    )
    return warn_ill_conditioned(where, report.kappa, threshold, evidence)


def check_conditioning(
    problem: FixedPointProblem,
    threshold: float = 1e6,
    *,
    solver: FixedPointSolver | str | None = None,
    z_star: Tensor | Sequence[Tensor] | None = None,
    fixed_point_tol: float | None = 1e-3,
    **estimate_kwargs: Any,
) -> ConditioningReport:
    """Estimate the conditioning at the problem's solution; warn if κ(I - J) > threshold.

    Args:
        problem: the fixed-point problem (f, z0, args).
        threshold: κ above which ``ConditioningWarning`` is issued.
        solver: forward solver used to find z* when ``z_star`` is not given; default
            ``CONVERGED_SOLVER`` (plain iteration to a relative residual of 1e-8 or 1000 steps),
            not a layer's truncated K-step solve.
        z_star: a solution already computed (skips the solve).
        fixed_point_tol: warn ``NotFixedPointWarning`` when the point's relative residual
            ``||f(z) - z|| / ||z||`` exceeds it (the numbers then describe J at that point, not
            at a fixed point); None disables the warning.
        **estimate_kwargs: forwarded to ``estimate_conditioning``.
    """
    if z_star is None:
        with torch.no_grad():
            z_star = problem.solve(solver=solver or CONVERGED_SOLVER, adjoint="one_step").value
    report = estimate_conditioning(problem.f, z_star, *problem.args, **estimate_kwargs)
    logger.debug("conditioning: %s", report)
    if fixed_point_tol is not None and not report.fixed_point_residual <= fixed_point_tol:
        warnings.warn(
            f"check_conditioning: the point analysed is not a fixed point (relative residual "
            f"{report.fixed_point_residual:.3e} > fixed_point_tol={fixed_point_tol:g}); the "
            "numbers describe J there, not at a fixed point. Solve further (a solver with a "
            "tolerance and more steps) or pass the converged z_star.",
            NotFixedPointWarning,
            stacklevel=user_stacklevel(),
        )
    warn_if_ill_conditioned(report, threshold)
    return report


def contraction_factors(residuals: Tensor) -> Tensor:
    """Per-step contraction ``||z_{k+1} - z_k|| / ||z_k - z_{k-1}||`` from a residual trace.

    Args:
        residuals: (steps, B) residual trace (``Solution.stats.residuals``; a fixed-budget
            ``FixedPointIteration`` records it with ``trace=True``); for plain
            iteration ``residuals[k] = ||z_{k+1} - z_k||``.

    Returns:
        (steps - 1, B) ratios; NaN where the previous residual is 0.
    """
    if residuals.ndim != 2:
        raise ValueError(
            f"residuals must be (steps, B), got shape {tuple(residuals.shape)}; "
            "pass Solution.stats.residuals"
        )
    prev, nxt = residuals[:-1], residuals[1:]
    return torch.where(prev > 0, nxt / prev.clamp_min(torch.finfo(prev.dtype).tiny), math.nan)


def contraction_rate(residuals: Tensor, tail: int | None = None) -> Tensor:
    """(B,) geometric-mean contraction over the last ``tail`` steps (all when None):
    ``(r_last / r_first) ** (1 / (n - 1))``; an empirical estimate of the spectral radius of J
    for plain iteration. NaN with fewer than two positive residuals."""
    trace = residuals if tail is None else residuals[-(tail + 1) :]
    if trace.shape[0] < 2:
        return torch.full(trace.shape[1:], math.nan, dtype=trace.dtype, device=trace.device)
    first, last = trace[0], trace[-1]
    ok = (first > 0) & (last > 0)
    ratio = last / first.clamp_min(torch.finfo(first.dtype).tiny)
    rate = ratio.clamp_min(torch.finfo(first.dtype).tiny) ** (1.0 / (trace.shape[0] - 1))
    return torch.where(ok, rate, math.nan)
