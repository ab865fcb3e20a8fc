"""Hypothesis strategies and outcome checks shared by the fuzzed-input tests.

Tensors are built from a drawn ``ValueSpec`` (kind, sign, magnitude, seed) with a
``torch.Generator``, not element by element by hypothesis: an example is small to print, cheap to
draw, and rebuilding a printed spec gives the same tensor.

Value kinds (each with a sign: non-negative, mixed or negative):

* ``random``: |N(0, 1)|; ``zeros``; ``constant``: one value 10^e, e in [-3, 3], everywhere;
* ``huge``: |N(0, 1)| * 10^e with e in [6, 30] (float32) or [6, 100] (float64);
* ``tiny``: |N(0, 1)| * 10^e with e in [-30, -8];
* ``wide``: every entry with its own exponent in [-30, 30] / [-100, 100]: tiny to huge at once;
* ``nonfinite``: ``random`` with one entry replaced by NaN, +inf or -inf.

The property every fuzzed call must satisfy: it raises one of the documented errors with a
message naming the problem, or everything it returns (values, gradients) is finite; the only
warnings allowed are ``ConvergenceWarning`` and ``ConditioningWarning``. The three ways to
break it have their own ``AssertionError`` subclasses, so a known bug can be marked
``xfail(raises=...)`` without hiding a different failure of the same test.
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
import torch
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from torch import Tensor

import implicit_ham as ih

KINDS = ("random", "zeros", "constant", "huge", "tiny", "wide", "nonfinite")
FINITE_KINDS = KINDS[:-1]
SIGNS = ("nonnegative", "mixed", "negative")
DTYPES = (torch.float32, torch.float64)
MAX_EXPONENT = {torch.float32: 30.0, torch.float64: 100.0}
TINY_EXPONENTS = (-30.0, -8.0)
ALLOWED_WARNINGS = (ih.ConvergenceWarning, ih.ConditioningWarning)
NON_FINITE_MESSAGE = r"non-finite|nan|inf"


def fuzz_settings(max_examples: int) -> settings:
    """Reproducible hypothesis settings: derandomized, no deadline, no example database, no
    shrinking (an example is a few small numbers already; shrinking would only cost time)."""
    return settings(
        max_examples=max_examples,
        deadline=None,
        derandomize=True,
        database=None,
        phases=(Phase.explicit, Phase.generate),
        report_multiple_bugs=False,
        suppress_health_check=(HealthCheck.too_slow, HealthCheck.filter_too_much),
    )


class SilentNonFiniteError(AssertionError):
    """A NaN or inf was returned (value or gradient) without an error."""


class UndocumentedError(AssertionError):
    """An exception of an undocumented type, or one whose message does not name the problem."""


class UnexpectedWarningError(AssertionError):
    """A warning other than ConvergenceWarning / ConditioningWarning."""


@dataclass(frozen=True)
class ValueSpec:
    """How to build one fuzzed tensor: kind, sign, magnitude exponent, bad value, seed."""

    kind: str
    sign: str
    exponent: float
    bad_value: float
    seed: int

    def build(self, shape: tuple[int, ...], dtype: torch.dtype) -> Tensor:
        """The CPU tensor of ``shape`` and ``dtype`` this spec describes."""
        gen = torch.Generator().manual_seed(self.seed)
        values = torch.randn(shape, generator=gen, dtype=torch.float64).abs()
        if self.kind == "zeros":
            values = torch.zeros(shape, dtype=torch.float64)
        elif self.kind == "constant":
            values = torch.full(shape, 10.0**self.exponent, dtype=torch.float64)
        elif self.kind == "wide":
            span = MAX_EXPONENT[dtype]
            exponents = (2 * torch.rand(shape, generator=gen, dtype=torch.float64) - 1) * span
            values = values * 10.0**exponents
        elif self.kind in ("huge", "tiny"):
            values = values * 10.0**self.exponent
        values = self._signed(values, gen)
        if self.kind == "nonfinite":
            index = int(torch.randint(values.numel(), (1,), generator=gen))
            values.view(-1)[index] = self.bad_value
        return values.to(dtype)

    def _signed(self, values: Tensor, gen: torch.Generator) -> Tensor:
        if self.sign == "negative":
            return -values
        if self.sign == "mixed":
            flips = torch.rand(values.shape, generator=gen, dtype=torch.float64) < 0.5
            return torch.where(flips, -values, values)
        return values


@st.composite
def value_specs(
    draw: st.DrawFn,
    dtype: torch.dtype,
    kinds: tuple[str, ...] = KINDS,
    signs: tuple[str, ...] = SIGNS,
) -> ValueSpec:
    """A ``ValueSpec`` of one of ``kinds`` whose magnitudes suit ``dtype``."""
    kind = draw(st.sampled_from(kinds))
    exponent = 0.0
    if kind == "huge":
        exponent = draw(st.floats(6.0, MAX_EXPONENT[dtype]))
    elif kind == "tiny":
        exponent = draw(st.floats(*TINY_EXPONENTS))
    elif kind == "constant":
        exponent = draw(st.floats(-3.0, 3.0))
    return ValueSpec(
        kind=kind,
        sign=draw(st.sampled_from(signs)),
        exponent=exponent,
        bad_value=draw(st.sampled_from((math.nan, math.inf, -math.inf))),
        seed=draw(st.integers(0, 2**20)),
    )


@dataclass
class Outcome:
    """What a fuzzed call did: its result (None if it raised), its error, its warnings."""

    result: object
    error: Exception | None
    warnings: list[warnings.WarningMessage]


def run_recording(fn: Callable[[], object]) -> Outcome:
    """Call ``fn``, catching any exception (the caller classifies it) and every warning;
    fail with ``UnexpectedWarningError`` on a warning other than the allowed two."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            outcome = Outcome(fn(), None, [])
        except Exception as err:
            outcome = Outcome(None, err, [])
    outcome.warnings = list(caught)
    unexpected = [w for w in caught if not issubclass(w.category, ALLOWED_WARNINGS)]
    if unexpected:
        raise UnexpectedWarningError([f"{w.category.__name__}: {w.message}" for w in unexpected])
    return outcome


def check_documented_error(error: BaseException, documented: dict[type, str]) -> None:
    """``error``'s exact type is a key of ``documented`` (so ``torch.linalg.LinAlgError``, a
    ``RuntimeError``, never passes for a documented ``RuntimeError`` subclass) and its message
    matches that key's regular expression (case-insensitive)."""
    pattern = documented.get(type(error))
    if pattern is None:
        names = ", ".join(t.__name__ for t in documented)
        raise UndocumentedError(
            f"undocumented {type(error).__name__} (documented here: {names}): {error}"
        ) from error
    if not re.search(pattern, str(error), re.IGNORECASE):
        raise UndocumentedError(
            f"{type(error).__name__} message does not name the problem ({pattern!r}): {error!r}"
        ) from error


def expect_error(outcome: Outcome, documented: dict[type, str]) -> None:
    """The call must have raised one of the ``documented`` errors."""
    if outcome.error is None:
        names = ", ".join(t.__name__ for t in documented)
        raise UndocumentedError(f"expected {names}; the call returned normally")
    check_documented_error(outcome.error, documented)


def check_finite(what: str, tensor: Tensor | None) -> None:
    """``tensor`` exists and holds no NaN or inf; else ``SilentNonFiniteError``."""
    if tensor is None:
        raise SilentNonFiniteError(f"{what}: no gradient reached it (None)")
    bad = ~torch.isfinite(tensor)
    if bool(bad.any()):
        raise SilentNonFiniteError(
            f"{what}: {int(bad.sum())} of {tensor.numel()} entries are NaN/inf, returned "
            "without an error"
        )


# Documented errors of a forward / backward pass on finite input, and the words they must use.
RUN_ERRORS = {
    ih.NonFiniteError: NON_FINITE_MESSAGE,
    ih.errors.BackwardSolveError: r"did not reach tol",
    ih.NotFixedPointError: r"not a fixed point of f: relative residual",
}


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    """One intra-op thread: the suite shares a 2-core machine and the tensors are tiny."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
