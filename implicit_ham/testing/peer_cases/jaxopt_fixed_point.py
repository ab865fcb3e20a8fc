"""jaxopt (google/jaxopt): ``tests/fixed_point_iteration_test.py`` and ``tests/anderson_test.py``.

The problems (facts carried over; jaxopt runs its tests in float32 unless x64 is enabled):

* geometric decay: ``f(x) = (0.9, 0.99, 0.999) * x`` from (1, 0.4, -0.2), tol 1e-5; the
  error is below tol and ``||x*|| < 1e-2`` (iteration: 8000 steps; Anderson: history 5,
  ridge 1e-6, 10000 steps).
* sin: ``(sin(x0) x0², x1³)`` from ((0.6, 0, -0.1), ((0.7), (0.5))) (Anderson adds a third leaf
  ``-x2`` from (-1, 0, 2, -0.4) / 3, history 3), tol 1e-6, the fixed point 0.
* cos: ``cos(x) + θ``, θ = (0, π/2), from (0.3, π/4), the fixed point (0.73908614842288, π/2):
  iteration tol 1e-2 in 1e5 steps (atol 1e-2; the second component's map has slope -1, so
  the iteration only creeps in: float32, as jaxopt ran it); Anderson history 4, 100 steps,
  tol 1e-6.
* scalars (Anderson): ``0.5 x + 0.5`` from 0, tol 1e-4.
* rotation (Anderson): block-diagonal rotations by π / (2, 3, 4, 5, 6, 1.27, 1.73) about
  c = (1, ..., 14), from U(0, 1)^14; history 10, ridge 1e-7, 400 steps, tol 1e-4; x* = c
  within 1e-3 (not a contraction: Banach's theorem does not apply, Anderson still works).
* gradients (``check_grads``, reverse mode, float64 tolerance 1e-5 with atol = rtol, eps
  1e-4; the differences of an implicit gradient are taken of a solve to 1e-13, the ones of
  an unrolled gradient of the same solve): cos from (0, π/4) (iteration, 4000 steps, tol
  1e-6; not converged, see the case) / (0, π/2) (Anderson, ridge 1e-5, 100 steps), with
  and without implicit differentiation; the flat landscape ``θ x``,
  θ = (0.05, 0.2) from (1, -0.5); the affine contraction ``M x + b``, n = 200, M symmetric
  U(-1, 1) scaled to spectral radius < 0.5, b ~ U(0, 1), 100 steps, tol 1e-6.

jaxopt's JAX PRNG draws (x0 of the rotation, M and b) are drawn here from a seeded
``torch.Generator`` with the same distributions.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from torch import Tensor

from implicit_ham.adjoints.modes import Adjoint, Implicit, Unroll
from implicit_ham.problems.fixed_point import fixed_point
from implicit_ham.solvers.accelerated import Anderson
from implicit_ham.solvers.base import FixedPointSolver
from implicit_ham.solvers.iteration import FixedPointIteration
from implicit_ham.solvers.minimizers import Minimizer
from implicit_ham.testing.peer_cases.common import (
    F64,
    PeerCase,
    directional_error,
    grad_check,
    many,
    not_applicable,
    one,
    require_allclose,
)
from implicit_ham.testing.report import require

PEER = "jaxopt"
FPI = "tests/fixed_point_iteration_test.py"
AA = "tests/anderson_test.py"
COS_STAR = (0.73908614842288, math.pi / 2)
JAX_GRAD_TOL = 1e-5  # jax.test_util.check_grads, float64
# the finite differences of an implicit gradient are taken of this solve (see directional_error)
TIGHT = Anderson(max_steps=500, m=5, tol=1e-13, stop_mode="abs")


def _residual(f: Callable[..., Any], z: Any, *args: Any) -> float:
    fz = f(z, *args)
    if isinstance(z, tuple):
        return math.sqrt(sum(float(((a - b) ** 2).sum()) for a, b in zip(fz, z, strict=True)))
    return float((fz - z).norm())


def _geometric(solver: FixedPointSolver, _: Minimizer | None) -> dict[str, float]:
    ratios = torch.tensor([0.9, 0.99, 0.999], dtype=F64)

    def f(x: Tensor) -> Tensor:
        return ratios * x

    z = one(fixed_point(f, torch.tensor([[1.0, 0.4, -0.2]], dtype=F64), solver=solver))
    error, norm = _residual(f, z), float(z.norm())
    require(error < 1e-5 and norm < 1e-2, "not converged", error=error, norm=norm)
    return {"error": error, "norm": norm}


def _sin(solver: FixedPointSolver, third_leaf: bool, _: Minimizer | None) -> dict[str, float]:
    z0: tuple[Tensor, ...] = (
        torch.tensor([[0.6, 0.0, -0.1]], dtype=F64),
        torch.tensor([[[0.7], [0.5]]], dtype=F64),
    )
    if third_leaf:
        z0 += (torch.tensor([[[-1.0, 0.0, 2.0, -0.4]]], dtype=F64) / 3,)

    def f(z: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
        out = (torch.sin(z[0]) * z[0] ** 2, z[1] ** 3)
        return (*out, -z[2]) if third_leaf else out

    value = many(fixed_point(f, z0, solver=solver))
    error = _residual(f, value)
    norm = math.sqrt(sum(float((v**2).sum()) for v in value))
    require(error < 1e-6 and norm < 1e-6, "not the fixed point 0", error=error, norm=norm)
    return {"error": error, "norm": norm}


def _cos(
    solver: FixedPointSolver, dtype: torch.dtype, atol: float, _: Minimizer | None
) -> dict[str, float]:
    theta = torch.tensor([[0.0, math.pi / 2]], dtype=dtype)
    z0 = torch.tensor([[0.3, math.pi / 4]], dtype=dtype)
    value = one(fixed_point(lambda x, t: torch.cos(x) + t, z0, theta, solver=solver))
    return require_allclose(value, torch.tensor([COS_STAR], dtype=F64), atol, atol, "x*")


def _scalar(_: Minimizer | None) -> dict[str, float]:
    solver = Anderson(max_steps=10_000, m=5, lam=1e-6, tol=1e-4, stop_mode="abs")
    value = one(fixed_point(lambda x: 0.5 * x + 0.5, torch.zeros(1, 1, dtype=F64), solver=solver))
    error = abs(float(value) * 0.5 + 0.5 - float(value))
    require(error < 1e-4, "not converged", error=error)
    return {"error": error}


def _rotation(_: Minimizer | None) -> dict[str, float]:
    angles = math.pi / torch.tensor([2, 3, 4, 5, 6, 1.27, 1.73], dtype=F64)
    blocks = [
        torch.tensor([[math.cos(a), -math.sin(a)], [math.sin(a), math.cos(a)]], dtype=F64)
        for a in angles.tolist()
    ]
    rotation, center = torch.block_diag(*blocks), torch.arange(1, 15, dtype=F64)
    x0 = torch.rand(1, 14, generator=torch.Generator().manual_seed(0), dtype=F64)
    solver = Anderson(max_steps=400, m=10, lam=1e-7, tol=1e-4, stop_mode="abs")
    value = one(fixed_point(lambda x: (x - center) @ rotation.T + center, x0, solver=solver))
    return require_allclose(value, center[None], 1e-3, 0.0, "x* (the rotation centre)")


def _cos_grad(
    solver: FixedPointSolver,
    start: float,
    adjoint: Adjoint,
    reference: FixedPointSolver,
    _: Minimizer | None,
) -> dict[str, float]:
    theta = torch.tensor([[0.0, math.pi / 2]], dtype=F64)
    z0 = torch.tensor([[0.0, start]], dtype=F64)

    def solve(t: Tensor, tight: FixedPointSolver = solver) -> Tensor:
        return one(fixed_point(lambda x, t: torch.cos(x) + t, z0, t, solver=tight, adjoint=adjoint))

    error = directional_error(solve, [theta], 1e-4, reference=partial(solve, tight=reference))
    return grad_check(error, JAX_GRAD_TOL, "d x*/d θ")


def _flat(solver: FixedPointSolver, _: Minimizer | None) -> dict[str, float]:
    theta = torch.tensor([[0.05, 0.2]], dtype=F64)
    z0 = torch.tensor([[1.0, -0.5]], dtype=F64)

    def solve(t: Tensor, tight: FixedPointSolver = solver) -> Tensor:
        return one(fixed_point(lambda x, t: t * x, z0, t, solver=tight, adjoint=Implicit()))

    error = directional_error(solve, [theta], 1e-4, reference=partial(solve, tight=TIGHT))
    return grad_check(error, JAX_GRAD_TOL, "d x*/d θ")


def affine_contraction(n: int = 200, seed: int = 0) -> tuple[Tensor, Tensor]:
    """(M (n, n), b (1, n)): M symmetric U(-1, 1) + its transpose, scaled to spectral radius
    below 0.5; b ~ U(0, 1)."""
    gen = torch.Generator().manual_seed(seed)
    m = 2 * torch.rand(n, n, generator=gen, dtype=F64) - 1
    m = m + m.T
    m = m / (2 * torch.linalg.eigvalsh(m).abs().max() + 1e-4)
    return m, torch.rand(1, n, generator=gen, dtype=F64)


def _affine(solver: FixedPointSolver, _: Minimizer | None) -> dict[str, float]:
    matrix, b = affine_contraction()

    def f(x: Tensor, m: Tensor, b: Tensor) -> Tensor:
        return x @ m.T + b

    z = one(fixed_point(f, torch.zeros_like(b), matrix, b, solver=solver))
    error = _residual(f, z, matrix, b)
    require(error < 1e-6, "not converged", error=error)

    def solve(m: Tensor, b: Tensor, tight: FixedPointSolver = solver) -> Tensor:
        return one(fixed_point(f, torch.zeros_like(b), m, b, solver=tight, adjoint=Implicit()))

    tight = FixedPointIteration(max_steps=200, tol=1e-13, stop_mode="abs")  # contraction 0.5
    gap = directional_error(solve, [matrix, b], 1e-4, reference=partial(solve, tight=tight))
    return {"error": error, **grad_check(gap, JAX_GRAD_TOL, "d x*/d (M, b)")}


def cases() -> list[PeerCase]:
    """jaxopt's fixed-point cases (see the module docstring)."""
    fpi = partial(FixedPointIteration, stop_mode="abs")
    aa = partial(Anderson, stop_mode="abs")
    iterate = "FixedPointIteration(stop_mode='abs') (jaxopt's error is ||f(x) - x||)"
    anderson = "Anderson(m=history_size, lam=ridge, stop_mode='abs')"
    geo_aa = aa(max_steps=10_000, m=5, lam=1e-6, tol=1e-5)
    return [
        PeerCase(
            PEER,
            f"{FPI}::test_geometric_decay",
            "fpi_geometric",
            partial(_geometric, fpi(max_steps=8000, tol=1e-5)),
            iterate,
        ),
        PeerCase(
            PEER,
            f"{FPI}::test_sin_fixed_point",
            "fpi_sin",
            partial(_sin, fpi(max_steps=100, tol=1e-6), False),
            f"{iterate}; the pytree as a tuple state; jit: no counterpart needed",
        ),
        PeerCase(
            PEER,
            f"{FPI}::test_cos_fixed_point",
            "fpi_cos",
            partial(_cos, fpi(max_steps=100_000, tol=1e-2), torch.float32, 1e-2),
            f"{iterate}, float32 as jaxopt ran it (in float64 the slope -1 component "
            "needs more than 1e5 steps for tol 1e-2)",
            slow=True,
        ),
        not_applicable(
            PEER,
            f"{FPI}::test_has_aux",
            "fpi_has_aux",
            "has_aux (an auxiliary output carried through the iterations): no "
            "counterpart; close over or return extra state instead",
        ),
        PeerCase(
            PEER,
            f"{FPI}::test_simple_grads",
            "fpi_grads_implicit",
            partial(
                _cos_grad,
                fpi(max_steps=4000, tol=1e-6),
                math.pi / 4,
                Implicit(),
                fpi(max_steps=4000, tol=1e-6),
            ),
            f"{iterate} with Implicit(); the π/2 component (slope -1) is not converged in "
            "4000 steps (NotFixedPointWarning), so the differences are of the same solve, "
            "as jaxopt's are (against a solve to 1e-13 the gap is 2.1e-5)",
        ),
        PeerCase(
            PEER,
            f"{FPI}::test_simple_grads",
            "fpi_grads_unroll",
            partial(
                _cos_grad,
                fpi(max_steps=4000, tol=1e-6),
                math.pi / 4,
                Unroll(),
                fpi(max_steps=4000, tol=1e-6),
            ),
            f"{iterate} with Unroll() (implicit_diff=False)",
        ),
        PeerCase(
            PEER,
            f"{FPI}::test_grads_flat_landscape",
            "fpi_flat",
            partial(_flat, fpi(max_steps=1000, tol=1e-6)),
            f"{iterate} with Implicit(); has_aux dropped (the aux output is not used)",
        ),
        PeerCase(
            PEER,
            f"{FPI}::test_affine_contractive_mapping",
            "fpi_affine",
            partial(_affine, fpi(max_steps=100, tol=1e-6)),
            f"{iterate} with Implicit()",
            slow=True,
        ),
        PeerCase(
            PEER,
            f"{AA}::test_geometric_decay",
            "anderson_geometric",
            partial(_geometric, geo_aa),
            f"{anderson}; ours needs ~8900 steps here where plain iteration needs ~3000 "
            "(a forward-solver finding for accelerated.py, not investigated here)",
            slow=True,
        ),
        PeerCase(
            PEER,
            f"{AA}::test_support_for_scalars",
            "anderson_scalar",
            _scalar,
            f"{anderson}; a scalar as a (1, 1) state (states are batch-first)",
        ),
        PeerCase(
            PEER,
            f"{AA}::test_sin_fixed_point",
            "anderson_sin",
            partial(_sin, aa(max_steps=100_000, m=3, lam=1e-6, tol=1e-6), True),
            f"{anderson}; the nested pytree as a tuple of three leaves",
        ),
        PeerCase(
            PEER,
            f"{AA}::test_cos_fixed_point",
            "anderson_cos",
            partial(_cos, aa(max_steps=100, m=4, lam=1e-6, tol=1e-6), F64, 1e-6),
            anderson,
        ),
        PeerCase(PEER, f"{AA}::test_rotation_map", "anderson_rotation", _rotation, anderson),
        PeerCase(
            PEER,
            f"{AA}::test_simple_grads",
            "anderson_grads_implicit",
            partial(
                _cos_grad,
                aa(max_steps=100, m=5, lam=1e-5, tol=1e-6),
                math.pi / 2,
                Implicit(),
                TIGHT,
            ),
            f"{anderson} with Implicit()",
        ),
        not_applicable(
            PEER,
            f"{AA}::test_simple_grads",
            "anderson_grads_unroll",
            "implicit_diff=False differentiates through Anderson's steps; ours runs "
            "Anderson without gradient and refuses Unroll (ValueError): differentiate "
            "with Implicit, or unroll FixedPointIteration",
        ),
        PeerCase(
            PEER,
            f"{AA}::test_grads_flat_landscape",
            "anderson_flat",
            partial(_flat, aa(max_steps=10_000, m=5, lam=1e-6, tol=1e-6)),
            f"{anderson} with Implicit()",
        ),
        PeerCase(
            PEER,
            f"{AA}::test_affine_contractive_mapping",
            "anderson_affine",
            partial(_affine, aa(max_steps=100, m=5, lam=1e-6, tol=1e-6)),
            f"{anderson} with Implicit()",
            slow=True,
        ),
        not_applicable(
            PEER,
            f"{AA}::test_mixing_frequency",
            "anderson_mixing_frequency",
            "mixing_frequency (mix every k-th step only): ours mixes every step",
        ),
        not_applicable(
            PEER,
            f"{AA}::test_residuals_minimizer",
            "anderson_residuals_minimizer",
            "tests jaxopt's private minimize_residuals (the mixing weights' solve); "
            "no public counterpart",
        ),
    ]
