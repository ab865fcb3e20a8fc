"""What a conformance run produces: one ``CheckResult`` per (check, problem), a
``ConformanceReport`` collecting them, and ``ConformanceError`` for a failed check.

A check is a small function that measures numbers and calls ``require``; ``Checker.run`` turns
its outcome into a ``CheckResult``. With ``fail_fast=True`` (the default of every ``check_*``
function) the first failure raises ``ConformanceError``; with ``fail_fast=False`` every check
runs and the report lists the failures (``report.raise_if_failed()`` raises afterwards).
"""

from __future__ import annotations

import dataclasses
import logging
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

logger = logging.getLogger(__name__)

PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"


class ConformanceError(AssertionError):
    """A plug-in broke the contract: the message names the plug-in, the check, the problem and
    the measured numbers."""


class CheckFailedError(Exception):
    """Raised by ``require`` inside a check; ``Checker.run`` turns it into a failed result."""

    def __init__(self, message: str, measured: dict[str, float]) -> None:
        super().__init__(message)
        self.measured = measured


class NotApplicableError(Exception):
    """Raised inside a check that does not apply (e.g. a solver that refuses Unroll)."""


def require(condition: bool, message: str, **measured: float) -> None:
    """Fail the running check with ``message`` and the ``measured`` numbers unless
    ``condition`` holds."""
    if not condition:
        raise CheckFailedError(message, measured)


def require_close(err: float, tol: float, message: str, **measured: float) -> dict[str, float]:
    """Fail the running check with ``message`` (and ``err``, ``tol``, ``measured``) unless the
    relative error ``err <= tol``; return what a passing check reports: ``rel_error`` and
    ``tol``."""
    require(err <= tol, message, rel_error=err, tol=tol, **measured)
    return {"rel_error": err, "tol": tol}


@dataclass(frozen=True)
class CheckResult:
    """One check on one problem.

    Attributes:
        check: the check's name, e.g. "unroll_matches_finite_differences".
        problem: the panel problem's name, e.g. "tanh_f64".
        status: "passed", "failed" or "skipped".
        measured: the numbers the check measured (e.g. ``rel_error``, ``tol``).
        detail: why it failed or was skipped ("" when it passed).
        seconds: how long the check took.
    """

    check: str
    problem: str
    status: str
    measured: dict[str, float] = field(default_factory=dict)
    detail: str = ""
    seconds: float = 0.0

    def describe(self, plugin: str) -> str:
        """A one-line message naming the plug-in, the check, the problem and the numbers."""
        numbers = ", ".join(f"{k}={_fmt(v)}" for k, v in self.measured.items())
        text = f"{plugin}: check {self.check!r} on problem {self.problem!r} {self.status}"
        if self.detail:
            text += f": {self.detail}"
        return f"{text} [{numbers}]" if numbers else text


@dataclass
class ConformanceReport:
    """Every check a conformance run made on one plug-in.

    Attributes:
        plugin: the plug-in's repr.
        results: one ``CheckResult`` per (check, problem), in the order they ran.
        warnings: the warnings the plug-in emitted during the run (text), for information.
    """

    plugin: str
    results: list[CheckResult] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def passed(self) -> list[CheckResult]:
        """The checks that passed."""
        return [r for r in self.results if r.status == PASSED]

    @property
    def failed(self) -> list[CheckResult]:
        """The checks that failed."""
        return [r for r in self.results if r.status == FAILED]

    @property
    def skipped(self) -> list[CheckResult]:
        """The checks that did not apply."""
        return [r for r in self.results if r.status == SKIPPED]

    @property
    def ok(self) -> bool:
        """Whether no check failed."""
        return not self.failed

    def worst(self, check: str, number: str) -> float | None:
        """The largest value of ``measured[number]`` over the passed/failed runs of ``check``."""
        values = [
            r.measured[number] for r in self.results if r.check == check and number in r.measured
        ]
        return max(values) if values else None

    def raise_if_failed(self) -> None:
        """Raise ``ConformanceError`` listing every failed check, if any."""
        if self.failed:
            lines = [r.describe(self.plugin) for r in self.failed]
            raise ConformanceError(
                f"{len(lines)} conformance check(s) failed:\n" + "\n".join(lines)
            )

    def failures_by_check(self) -> dict[str, list[str]]:
        """``{check: [problems it failed on]}``, in the order the checks ran."""
        out: dict[str, list[str]] = {}
        for r in self.failed:
            out.setdefault(r.check, []).append(r.problem)
        return out

    def summary(self) -> str:
        """A short account: the counts, then each failed check with the problems it failed on
        and its first failure's message (``details()`` has every check)."""
        head = (
            f"{self.plugin}: {len(self.results)} checks, {len(self.passed)} passed, "
            f"{len(self.failed)} failed, {len(self.skipped)} skipped"
        )
        lines = [head]
        if self.failed:
            lines.append("failures by check:")
        for check, problems in self.failures_by_check().items():
            first = next(r for r in self.failed if r.check == check)
            per_problem = ", ".join(
                name if problems.count(name) == 1 else f"{name} x{problems.count(name)}"
                for name in dict.fromkeys(problems)
            )
            lines.append(f"  {check}: {len(problems)} ({per_problem})")
            lines.append(f"    first: {first.describe(self.plugin)}")
        return "\n".join(lines)

    def details(self) -> str:
        """Every check, one line each, in the order they ran."""
        return "\n".join(r.describe(self.plugin) for r in self.results)


class Checker:
    """Runs checks for one plug-in, recording each outcome in a ``ConformanceReport``.

    Args:
        plugin: the plug-in's description (its repr).
        fail_fast: raise ``ConformanceError`` at the first failure (else collect them all).
    """

    def __init__(self, plugin: str, fail_fast: bool) -> None:
        self.report = ConformanceReport(plugin)
        self.fail_fast = fail_fast

    def run(self, check: str, problem: str, body: Callable[[], dict[str, float] | None]) -> None:
        """Run ``body`` (which returns its measured numbers, or raises ``CheckFailedError`` /
        ``NotApplicableError``); an unexpected exception is a failure that names its type."""
        cause: BaseException | None = None
        start = time.perf_counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                result = CheckResult(check, problem, PASSED, dict(body() or {}))
            except NotApplicableError as skip:
                result = CheckResult(check, problem, SKIPPED, detail=str(skip))
            except CheckFailedError as failure:
                result = CheckResult(check, problem, FAILED, failure.measured, str(failure))
            except Exception as err:  # a crash inside the plug-in is a failed check too
                cause = err
                detail = f"raised {type(err).__name__}: {err}"
                result = CheckResult(check, problem, FAILED, detail=detail)
        result = dataclasses.replace(result, seconds=time.perf_counter() - start)
        self.report.warnings += [
            f"{check}/{problem}: {w.category.__name__}: {w.message}" for w in caught
        ]
        self.report.results.append(result)
        logger.debug("%s", result.describe(self.report.plugin))
        if result.status == FAILED and self.fail_fast:
            raise ConformanceError(result.describe(self.report.plugin)) from cause

    def finish(self) -> ConformanceReport:
        """The report; logs a one-line summary."""
        report = self.report
        logger.info(
            "%s: %d passed, %d failed, %d skipped",
            report.plugin,
            len(report.passed),
            len(report.failed),
            len(report.skipped),
        )
        return report


def _fmt(value: float) -> str:
    return f"{value:.3e}" if isinstance(value, float) else str(value)
