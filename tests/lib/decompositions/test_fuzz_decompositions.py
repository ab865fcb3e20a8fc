"""Fuzzed inputs for every decomposition under every backward mode.

Hypothesis draws the layout (B in 1..3, C in {2, 4, 6, 8}, groups dividing C, H and W in 1..9,
spatial or channel), the rank, the number of steps, the dtype (float32 / float64) and the values
(random, zeros, constants, huge, tiny, a wide mix of magnitudes, any sign; see
``fuzz_strategies``). The contract checked: a documented error whose message names the problem,
or a finite output AND a finite input gradient of a random linear loss (a documented error may
also come from the backward pass); ConvergenceWarning and ConditioningWarning are the only
warnings allowed. Never an undocumented exception, never a NaN/inf returned silently.

Each bug the fuzzer found has a pinned minimal reproduction at the end of this file, and its
inputs run as explicit examples in every cell (regression tests).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
from helpers.fuzz_strategies import (
    DTYPES,
    FINITE_KINDS,
    KINDS,
    RUN_ERRORS,
    SIGNS,
    ValueSpec,
    check_documented_error,
    check_finite,
    expect_error,
    fuzz_settings,
    one_thread,  # noqa: F401  (autouse fixture)
    run_recording,
    value_specs,
)
from hypothesis import assume, example, given
from hypothesis import strategies as st
from torch import Tensor

import implicit_ham as ih

DECOMPOSITIONS = {"nmf": ih.NMF, "vq": ih.VQ, "cd": ih.CD, "svd": ih.SVD}
# name -> (backward mode, grad_through_bases)
BACKWARD_MODES: dict[str, tuple[ih.plugins.Adjoint, bool]] = {
    "unroll": (ih.Unroll(), False),
    "truncated2": (ih.Truncated(2), False),
    "one_step": (ih.OneStep(), False),
    "one_step_bases": (ih.OneStep(), True),
    "phantom": (ih.Phantom(2, 0.5), False),
    "neumann": (ih.Neumann(5, 0.5), False),
    "implicit": (ih.Implicit(max_steps=30), False),
    "implicit_fallback": (ih.Implicit(on_divergence="fallback"), False),
}
# Documented errors of a forward / backward pass on finite input, and the words they must use.


@dataclass(frozen=True)
class LayerCase:
    """One fuzzed call: the feature-map layout, the layer's settings and the input values."""

    batch: int
    channels: int
    groups: int
    height: int
    width: int
    spatial: bool
    dtype: torch.dtype
    rank: int
    steps: int
    values: ValueSpec

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """(B, C, H, W)."""
        return self.batch, self.channels, self.height, self.width

    @property
    def d_n(self) -> tuple[int, int]:
        """(d, n) of the flattened X (B*S, d, n) in this layout."""
        per_group, pixels = self.channels // self.groups, self.height * self.width
        return (per_group, pixels) if self.spatial else (pixels, per_group)

    def layer(self, decomposition: str, mode: str) -> ih.Decomposition:
        """The layer under test (random init, training mode, ``steps`` iterations)."""
        adjoint, through_bases = BACKWARD_MODES[mode]
        return DECOMPOSITIONS[decomposition](
            rank=self.rank,
            groups=self.groups,
            steps=self.steps,
            spatial=self.spatial,
            adjoint=adjoint,
            grad_through_bases=through_bases,
        )

    def tensors(self) -> tuple[Tensor, Tensor]:
        """The input x (B, C, H, W), requiring grad, and the random weight of the loss."""
        x = self.values.build(self.shape, self.dtype).requires_grad_()
        gen = torch.Generator().manual_seed(self.values.seed + 1)
        weight = torch.randn(self.shape, generator=gen, dtype=torch.float64).to(self.dtype)
        return x, weight


@st.composite
def layer_cases(
    draw: st.DrawFn, kinds: tuple[str, ...], signs: tuple[str, ...], valid_rank: bool
) -> LayerCase:
    """A ``LayerCase``; with ``valid_rank`` the rank is < min(d, n), else any of 1..9."""
    channels = draw(st.sampled_from((2, 4, 6, 8)))
    groups = draw(st.sampled_from([g for g in range(1, channels + 1) if channels % g == 0]))
    dtype = draw(st.sampled_from(DTYPES))
    case = LayerCase(
        batch=draw(st.integers(1, 3)),
        channels=channels,
        groups=groups,
        height=draw(st.integers(1, 9)),
        width=draw(st.integers(1, 9)),
        spatial=draw(st.booleans()),
        dtype=dtype,
        rank=1,
        steps=draw(st.integers(1, 4)),
        values=draw(value_specs(dtype, kinds, signs)),
    )
    low = min(case.d_n)
    if valid_rank:
        assume(low >= 2)
        rank = draw(st.integers(1, low - 1))
    else:
        rank = draw(st.integers(1, 9))
    return dataclasses.replace(case, rank=rank)


def check_call(layer: ih.Decomposition, x: Tensor, weight: Tensor, seed: int) -> None:
    """The contract for one call: ``layer(x)`` (its random bases drawn after seeding torch's
    RNG with ``seed``, the caller's RNG state restored), then the backward pass of the linear
    loss ``sum(weight * y)``. x (B, C, H, W) requires grad; weight has its shape."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        forward = run_recording(lambda: layer(x))
    if forward.error is not None:
        check_documented_error(forward.error, RUN_ERRORS)
        return
    y = forward.result
    check_finite("output", y)
    backward = run_recording(lambda: (y * weight).sum().backward())
    if backward.error is not None:
        check_documented_error(backward.error, RUN_ERRORS)
        return
    check_finite("input gradient", x.grad)


def run_forward_backward(layer: ih.Decomposition, case: LayerCase) -> None:
    """``check_call`` on the case's input and loss weight."""
    x, weight = case.tensors()
    check_call(layer, x, weight, case.values.seed)


def bug_input(
    shape: tuple[int, int, int, int],
    spatial: bool,
    dtype: torch.dtype,
    rank: int,
    steps: int,
    kind: str,
    sign: str,
    exponent: float,
    seed: int,
) -> LayerCase:
    """A ``LayerCase`` with one group, written out (the explicit examples below)."""
    batch, channels, height, width = shape
    values = ValueSpec(kind, sign, exponent, math.nan, seed)
    return LayerCase(batch, channels, 1, height, width, spatial, dtype, rank, steps, values)


# Inputs on which the fuzzer found bugs (silent NaN gradients, GMRES crashing on a NaN
# Jacobian; now fixed), run first in every cell as explicit examples: regression tests.
KNOWN_BUG_INPUTS = (
    # Rank-deficient X (constant or zero, rank <= 1 < r): SVD's QR of X C has no derivative.
    bug_input((1, 4, 2, 3), True, torch.float64, 3, 1, "constant", "nonnegative", -2.0, 69),
    bug_input((1, 6, 3, 3), False, torch.float32, 3, 1, "zeros", "nonnegative", 0.0, 7),
    bug_input((1, 4, 4, 3), True, torch.float32, 2, 1, "constant", "negative", 0.0, 86),
    bug_input((2, 6, 1, 4), True, torch.float32, 2, 3, "constant", "nonnegative", -2.0, 44),
    # float32 values of 1e12 to 1e19: the forward is finite, the backward overflows.
    bug_input((1, 6, 2, 4), False, torch.float32, 5, 1, "huge", "negative", 16.0, 56),
    bug_input((2, 4, 3, 3), True, torch.float32, 2, 1, "huge", "nonnegative", 15.0, 39),
    bug_input((1, 4, 3, 2), True, torch.float32, 3, 2, "huge", "mixed", 19.0, 63),
    bug_input((2, 4, 3, 4), True, torch.float32, 3, 1, "huge", "mixed", 19.0, 53),
    bug_input((1, 8, 2, 3), True, torch.float32, 5, 1, "huge", "nonnegative", 16.0, 13),
    bug_input((1, 8, 4, 4), False, torch.float32, 2, 3, "huge", "negative", 12.0, 82),
    bug_input((2, 4, 4, 4), False, torch.float32, 3, 2, "huge", "negative", 12.0, 78),
)


def with_known_bug_inputs(test: Callable[..., None]) -> Callable[..., None]:
    """Decorate a ``@given(case=...)`` test with ``KNOWN_BUG_INPUTS`` as explicit examples."""
    for case in reversed(KNOWN_BUG_INPUTS):
        test = example(case=case)(test)
    return test


def fuzz_cells() -> list[tuple[str, str]]:
    """Every (decomposition, backward mode) pair."""
    return [(d, m) for d in DECOMPOSITIONS for m in BACKWARD_MODES]


@pytest.mark.parametrize(("decomposition", "mode"), fuzz_cells())
@fuzz_settings(max_examples=40)
@with_known_bug_inputs
@given(case=layer_cases(FINITE_KINDS, SIGNS, valid_rank=True))
def test_fuzzed_input_gives_finite_output_and_gradient_or_documented_error(
    decomposition: str, mode: str, case: LayerCase
) -> None:
    if decomposition == "nmf":  # NMF's domain; negative input is the next test's business
        case = dataclasses.replace(
            case, values=dataclasses.replace(case.values, sign="nonnegative")
        )
    run_forward_backward(case.layer(decomposition, mode), case)


@pytest.mark.parametrize("decomposition", DECOMPOSITIONS)
@fuzz_settings(max_examples=30)
@given(data=st.data())
def test_invalid_input_raises_the_documented_error(decomposition: str, data: st.DataObject) -> None:
    """NaN/inf anywhere -> NonFiniteError; rank >= min(d, n) -> ValueError naming the rank;
    a negative entry for NMF -> ValueError asking for non-negative input. Checked in this
    order of precedence, under any backward mode."""
    case = data.draw(layer_cases(KINDS, SIGNS, valid_rank=False), label="case")
    x = case.values.build(case.shape, case.dtype)
    mode = data.draw(st.sampled_from(list(BACKWARD_MODES)), label="mode")
    if case.values.kind == "nonfinite":
        expected = {ih.NonFiniteError: r"NaN or infinity.*check the layer"}
    elif case.rank >= min(case.d_n):
        expected = {ValueError: rf"rank={case.rank} must be smaller than min\(d, n\).*Lower"}
    elif decomposition == "nmf" and bool((x < 0).any()):
        expected = {ValueError: r"non-negative input.*ReLU"}
    else:
        assume(False)
    layer = case.layer(decomposition, mode)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(case.values.seed)
        expect_error(run_recording(lambda: layer(x.requires_grad_())), expected)


# --------------------------------------------------------------------------------------------
# Regression tests: pinned minimal reproductions of bugs the fuzzer found (now fixed).


def pinned_run(layer: ih.Decomposition, x: Tensor) -> None:
    """``check_call`` on one explicit input with the loss ``sum(y)``, bases seeded with 0."""
    check_call(layer, x.requires_grad_(), torch.ones_like(x), seed=0)


@pytest.mark.parametrize("mode", ["unroll", "truncated2", "one_step_bases", "phantom"])
def test_pinned_svd_on_zero_input_gradient_is_finite_or_a_documented_error(mode: str) -> None:
    """QR of X C = 0 has no derivative (the fuzzer found its inf/NaN reaching x.grad)."""
    adjoint, through_bases = BACKWARD_MODES[mode]
    layer = ih.SVD(rank=1, steps=2, adjoint=adjoint, grad_through_bases=through_bases)
    pinned_run(layer, torch.zeros(1, 4, 3, 3, dtype=torch.float64))


@pytest.mark.parametrize("mode", ["implicit", "implicit_fallback"])
def test_pinned_svd_implicit_on_zero_input_is_finite_or_a_documented_error(mode: str) -> None:
    """Found by the fuzzer: the incoming gradient is exactly 0, so g = 0; the residual check
    sees J^T g = NaN and reports 'did not reach tol (relative residual nan)' as a
    ConvergenceWarning; the NaN then flows into x.grad through (df/dx)^T g."""
    layer = ih.SVD(rank=1, steps=2, adjoint=BACKWARD_MODES[mode][0])
    pinned_run(layer, torch.zeros(1, 4, 3, 3, dtype=torch.float64))


@pytest.mark.parametrize("mode", ["unroll", "one_step_bases"])
def test_pinned_nmf_float32_large_input_gradient_is_finite_or_a_documented_error(mode: str) -> None:
    """Forward finite (values ~1e14); the fuzzer found the float32 backward overflowing."""
    x = torch.rand(1, 4, 3, 3, generator=torch.Generator().manual_seed(0)) * 1e14
    adjoint, through_bases = BACKWARD_MODES[mode]
    layer = ih.NMF(rank=1, steps=3, adjoint=adjoint, grad_through_bases=through_bases)
    pinned_run(layer, x)


def test_pinned_svd_implicit_on_constant_input_is_finite_or_a_documented_error() -> None:
    """X = constant has rank 1 < r = 2: J^T is non-finite (GMRES once passed NaN to lstsq)."""
    layer = ih.SVD(rank=2, steps=2, adjoint=ih.Implicit(max_steps=30))
    pinned_run(layer, torch.full((1, 4, 3, 3), 0.5, dtype=torch.float64))
