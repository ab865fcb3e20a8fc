"""Fuzzed fixed-point problems for ``ih.fixed_point`` under every solver and every adjoint.

Hypothesis draws a random small map ``z' = tanh(W z + x)`` on a random state structure (a
Tensor or a tuple of 1-3 tensors of shapes (B, ...), B in 1..3), with W rescaled to a spectral
norm in [0.1, 3] (contractive to expansive), float32 or float64, and inputs x of every value
kind of ``fuzz_strategies`` (zeros, huge, tiny, mixed magnitudes, a NaN or inf). The contract:
a finite value and finite gradients for x and W of a random linear loss, or NonFiniteError /
BackwardSolveError / ValueError (a solver budget the adjoint cannot use) with a message naming
the problem; ConvergenceWarning and ConditioningWarning are the only warnings allowed. With
FixedPointIteration the value is bitwise identical under every value-preserving adjoint.
Bugs it found have pinned reproductions at the end (regression tests).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
from helpers.fuzz_strategies import (
    DTYPES,
    RUN_ERRORS,
    ValueSpec,
    check_documented_error,
    check_finite,
    fuzz_settings,
    one_thread,  # noqa: F401  (autouse fixture)
    run_recording,
    value_specs,
)
from hypothesis import given
from hypothesis import strategies as st
from torch import Tensor

import implicit_ham as ih

SOLVER_KINDS = ("fixed_point", "fixed_point_tol", "anderson", "broyden")
ADJOINTS: dict[str, ih.plugins.Adjoint] = {
    "unroll": ih.Unroll(),
    "truncated2": ih.Truncated(2),
    "one_step": ih.OneStep(),
    "phantom": ih.Phantom(2, 0.5),
    "phantom_tau1": ih.Phantom(2, 1.0),
    "neumann": ih.Neumann(5, 0.5),
    "implicit_gmres": ih.Implicit(max_steps=30),
    "implicit_dense": ih.Implicit(linear_solver="dense"),
    "implicit_fixed_point": ih.Implicit(linear_solver="fixed_point", max_steps=30),
    "implicit_anderson": ih.Implicit(linear_solver="anderson", max_steps=30),
    "implicit_broyden": ih.Implicit(linear_solver="broyden", max_steps=30),
    "implicit_raise": ih.Implicit(max_steps=30, on_divergence="raise"),
    "implicit_fallback": ih.Implicit(max_steps=30, on_divergence="fallback"),
}
BUDGET_ERROR = r"cannot be unrolled"


@dataclass(frozen=True)
class MapCase:
    """A fuzzed problem ``z = tanh(W flat(z) + x)`` and the solver settings to solve it with.

    Attributes:
        batch: B. shapes: each state tensor's shape without B. as_tuple: pass z0 as a tuple
        (always when there are several tensors). dtype. spectral_norm: ||W||_2. inputs: the
        values of x (B, N). seed: for W, z0 and the loss weights. max_steps, tol, damping,
        memory: the solver's settings (memory: Anderson's m).
    """

    batch: int
    shapes: tuple[tuple[int, ...], ...]
    as_tuple: bool
    dtype: torch.dtype
    spectral_norm: float
    inputs: ValueSpec
    seed: int
    max_steps: int
    tol: float | None
    damping: float
    memory: int

    @property
    def width(self) -> int:
        """N: entries of one sample's state, all tensors together."""
        return sum(int(torch.Size(s).numel()) for s in self.shapes)

    def solver(self, kind: str) -> ih.plugins.FixedPointSolver:
        """The forward solver of ``kind`` with this case's settings."""
        if kind == "fixed_point":
            return ih.FixedPointIteration(max_steps=self.max_steps, damping=self.damping)
        if kind == "fixed_point_tol":
            tol = self.tol or 1e-4
            return ih.FixedPointIteration(max_steps=self.max_steps, tol=tol, damping=self.damping)
        if kind == "anderson":
            return ih.Anderson(max_steps=max(self.max_steps, 4), tol=self.tol, m=self.memory)
        return ih.Broyden(max_steps=max(self.max_steps, 3), tol=self.tol)

    def problem(self) -> tuple[Callable[..., object], object, Tensor, Tensor]:
        """``(f, z0, x, W)``: x (B, N) and W (N, N) require grad; z0 matches ``shapes``."""
        gen = torch.Generator().manual_seed(self.seed)
        weight = torch.randn(self.width, self.width, generator=gen, dtype=torch.float64)
        weight = self.spectral_norm * weight / torch.linalg.matrix_norm(weight, ord=2)
        weight = weight.to(self.dtype).requires_grad_()
        x = self.inputs.build((self.batch, self.width), self.dtype).requires_grad_()
        parts = tuple(
            torch.randn(self.batch, *s, generator=gen, dtype=torch.float64).to(self.dtype)
            for s in self.shapes
        )
        return tanh_map(self.batch, self.shapes, self.as_tuple), self.restore(parts), x, weight

    def restore(self, parts: tuple[Tensor, ...]) -> Tensor | tuple[Tensor, ...]:
        """The user-facing structure: a tuple, or the single tensor."""
        return parts if self.as_tuple else parts[0]

    def loss_weights(self) -> tuple[Tensor, ...]:
        """Random weights of the linear loss, one per state tensor."""
        gen = torch.Generator().manual_seed(self.seed + 1)
        return tuple(
            torch.randn(self.batch, *s, generator=gen, dtype=torch.float64).to(self.dtype)
            for s in self.shapes
        )


def tanh_map(
    batch: int, shapes: tuple[tuple[int, ...], ...], as_tuple: bool
) -> Callable[..., object]:
    """``f(z, x, W) = split(tanh(flat(z) W^T + x))``: every state tensor feeds every other."""
    sizes = [int(torch.Size(s).numel()) for s in shapes]

    def f(z: Tensor | tuple[Tensor, ...], x: Tensor, weight: Tensor) -> object:
        parts = z if as_tuple else (z,)
        flat = torch.cat([t.reshape(batch, -1) for t in parts], dim=1)
        out = torch.tanh(flat @ weight.T + x)
        chunks = torch.split(out, sizes, dim=1)
        result = tuple(c.reshape(batch, *s) for c, s in zip(chunks, shapes, strict=True))
        return result if as_tuple else result[0]

    return f


@st.composite
def map_cases(draw: st.DrawFn) -> MapCase:
    """A ``MapCase``: structure, dtype, spectral norm, input values and solver settings."""
    count = draw(st.integers(1, 3))
    shapes = tuple(
        tuple(draw(st.lists(st.integers(1, 3), min_size=1, max_size=2))) for _ in range(count)
    )
    dtype = draw(st.sampled_from(DTYPES))
    return MapCase(
        batch=draw(st.integers(1, 3)),
        shapes=shapes,
        as_tuple=count > 1 or draw(st.booleans()),
        dtype=dtype,
        spectral_norm=draw(st.floats(0.1, 3.0)),
        inputs=draw(value_specs(dtype)),
        seed=draw(st.integers(0, 2**20)),
        max_steps=draw(st.integers(2, 25)),
        tol=draw(st.sampled_from((None, 1e-3, 1e-6))),
        damping=draw(st.sampled_from((1.0, 0.5))),
        memory=draw(st.integers(2, 5)),
    )


def gradient_steps(adjoint: ih.plugins.Adjoint, solver: ih.plugins.FixedPointSolver) -> int:
    """How many trailing forward steps ``adjoint`` asks the solver to take with gradient."""
    if isinstance(adjoint, ih.plugins.ThroughIterations):
        return adjoint.grad_steps(solver)
    return 0


def budget_is_too_small(
    kind: str, solver: ih.plugins.FixedPointSolver, adjoint: ih.plugins.Adjoint
) -> bool:
    """Whether an accelerated solver must reject this adjoint (documented ValueError): all its
    steps would need gradient, and its accelerated steps are not differentiable."""
    if not kind.startswith(("anderson", "broyden")):
        return False
    return gradient_steps(adjoint, solver) >= solver.max_steps


def solve_and_differentiate(case: MapCase, kind: str, adjoint: ih.plugins.Adjoint) -> Tensor | None:
    """Check the contract for one call; return the value's first tensor (None if it raised)."""
    f, z0, x, weight = case.problem()
    solver = case.solver(kind)
    forward = run_recording(
        lambda: ih.fixed_point(f, z0, x, weight, solver=solver, adjoint=adjoint)
    )
    if budget_is_too_small(kind, solver, adjoint):
        assert forward.error is not None, "an unusable solver budget was accepted"
        check_documented_error(forward.error, {ValueError: BUDGET_ERROR})
        return None
    if forward.error is not None:
        check_documented_error(forward.error, RUN_ERRORS)
        return None
    parts = forward.result.value if case.as_tuple else (forward.result.value,)
    for i, part in enumerate(parts):
        check_finite(f"value[{i}]", part)
    loss = sum((p * w).sum() for p, w in zip(parts, case.loss_weights(), strict=True))
    backward = run_recording(lambda: torch.autograd.grad(loss, (x, weight), allow_unused=True))
    if backward.error is not None:
        check_documented_error(backward.error, RUN_ERRORS)
    else:
        for name, grad in zip(("x", "W"), backward.result, strict=True):
            check_finite(f"gradient of {name}", grad)
    return parts[0].detach()


@pytest.mark.parametrize("adjoint", ADJOINTS)
@pytest.mark.parametrize("kind", SOLVER_KINDS)
@fuzz_settings(max_examples=20)
@given(case=map_cases())
def test_fuzzed_map_gives_finite_value_and_gradient_or_documented_error(
    kind: str, adjoint: str, case: MapCase
) -> None:
    solve_and_differentiate(case, kind, ADJOINTS[adjoint])


def forward_values(case: MapCase, kind: str, names: tuple[str, ...]) -> dict[str, Tensor | None]:
    """The value's first tensor under each adjoint of ``names`` (None where the call raised),
    each call checked against the contract."""
    return {name: solve_and_differentiate(case, kind, ADJOINTS[name]) for name in names}


class ValueChangedError(AssertionError):
    """A backward mode changed the forward value (or raised where the reference did not)."""


def assert_same_values(values: dict[str, Tensor | None], reference: str) -> None:
    """Every value equals ``values[reference]`` bit for bit, or all calls raised."""
    expected = values[reference]
    for name, value in values.items():
        if (expected is None) != (value is None):
            raise ValueChangedError(f"{name} and {reference} disagree on raising")
        if value is not None and not torch.equal(value, expected):
            gap = float((value.double() - expected.double()).abs().max())
            raise ValueChangedError(f"{name} changed the forward value (max gap {gap:.3e})")


@pytest.mark.parametrize("damping", [1.0, 0.5])
@pytest.mark.parametrize("kind", SOLVER_KINDS)
@fuzz_settings(max_examples=25)
@given(case=map_cases())
def test_fuzzed_value_is_identical_under_every_adjoint(
    kind: str, damping: float, case: MapCase
) -> None:
    """Every solver: all backward modes (Phantom at any tau included) return the same value
    bit for bit, or all raise in the forward pass (Unroll through an accelerated solver is
    refused, so it is compared for plain iteration only)."""
    case = dataclasses.replace(case, damping=damping)
    names = tuple(n for n in ADJOINTS if n != "unroll" or kind.startswith("fixed_point"))
    assert_same_values(forward_values(case, kind, names), names[-1])


# --------------------------------------------------------------------------------------------
# Regression tests: pinned reproductions of bugs the fuzzer found (now fixed).
# The map sqrt(z^2) / 2 + x has the fixed point z* = 0 at x = 0, where its Jacobian is
# 0 * inf = NaN: a finite forward value whose backward pass meets a non-finite Jacobian.


def kinked_map(z: Tensor, x: Tensor) -> Tensor:
    """``sqrt(z^2) / 2 + x`` elementwise; z, x: (B, n). Its derivative at z = 0 is NaN."""
    return 0.5 * torch.sqrt(z * z) + x


def kinked_gradient(adjoint: ih.plugins.Adjoint) -> None:
    """Solve the kinked map at its fixed point 0, then check the contract on d(sum z*)/dx."""
    x = torch.zeros(1, 3, dtype=torch.float64, requires_grad=True)
    solution = ih.fixed_point(
        kinked_map,
        torch.zeros(1, 3, dtype=torch.float64),
        x,
        solver=ih.FixedPointIteration(max_steps=3),
        adjoint=adjoint,
    )
    check_finite("value", solution.value)
    backward = run_recording(lambda: torch.autograd.grad(solution.value.sum(), x)[0])
    if backward.error is not None:
        check_documented_error(backward.error, RUN_ERRORS)
    else:
        check_finite("gradient of x", backward.result)


@pytest.mark.parametrize("adjoint", [ih.Unroll(), ih.Truncated(2), ih.Phantom(2, 0.5)])
def test_pinned_nan_jacobian_gradient_is_finite_or_a_documented_error(
    adjoint: ih.plugins.Adjoint,
) -> None:
    kinked_gradient(adjoint)


# a deliberate subset: the Krylov and the dense solve (Anderson / Broyden: the next test)
@pytest.mark.parametrize("linear_solver", ["gmres", "dense"])
@pytest.mark.parametrize("on_divergence", ["warn", "raise", "fallback"])
def test_pinned_nan_jacobian_implicit_gradient_is_finite_or_a_documented_error(
    linear_solver: str, on_divergence: str
) -> None:
    kinked_gradient(ih.Implicit(linear_solver=linear_solver, on_divergence=on_divergence))


# the accelerated linear solvers, whose failure mode is a NaN iterate the fallback must catch
@pytest.mark.parametrize("linear_solver", ["anderson", "broyden"])
def test_pinned_fallback_is_honoured_by_anderson_and_broyden(linear_solver: str) -> None:
    x = torch.zeros(1, 3, dtype=torch.float64, requires_grad=True)
    adjoint = ih.Implicit(linear_solver=linear_solver, on_divergence="fallback")
    solution = ih.fixed_point(
        kinked_map, torch.zeros(1, 3, dtype=torch.float64), x, adjoint=adjoint
    )
    outcome = run_recording(lambda: torch.autograd.grad(solution.value.sum(), x)[0])
    assert outcome.error is None, f"fallback raised {type(outcome.error).__name__}"
    assert solution.backward_stats is not None and solution.backward_stats.fallback
