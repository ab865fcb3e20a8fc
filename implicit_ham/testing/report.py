"""What a conformance run produces: one ``CheckResult`` per (check, problem), a
``ConformanceReport`` collecting them, and ``ConformanceError`` for a failed check.

A check is a small function that measures numbers and calls ``require``; ``Checker.run`` turns
its outcome into a ``CheckResult``: passed, failed, "not applicable" (the check's premise is
absent by design: an empty batch has no gradient to check, a solver that declares it cannot be
unrolled, a surrogate's second derivative) or skipped (the kit could not check it: it lacks
what it needs, e.g. the gradient an unknown backward mode must give). ``ok`` means "checked and
right": no failure, and no skipped check unless the caller accepted it (``allow_skips``).

With ``fail_fast=True`` (the default of every ``check_*`` function) the first failure raises
``ConformanceError``, and so does the end of a run with a skip that was not accepted; with
``fail_fast=False`` every check runs and the report lists them (``report.raise_if_failed()``
raises afterwards).
"""

from __future__ import annotations

import dataclasses
import logging
import time
import warnings
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

logger = logging.getLogger(__name__)

PASSED, FAILED, SKIPPED, NOT_APPLICABLE = "passed", "failed", "skipped", "not applicable"

AllowSkips = bool | Collection[str]


class ConformanceError(AssertionError):
    """A plug-in broke the contract: the message names the plug-in, the check, the problem and
    the measured numbers."""


class CheckFailedError(Exception):
    """Raised by ``require`` inside a check; ``Checker.run`` turns it into a failed result."""

    def __init__(self, message: str, measured: dict[str, float]) -> None:
        super().__init__(message)
        self.measured = measured


class NotApplicableError(Exception):
    """Raised inside a check whose premise is absent by design (a solver that declares it
    cannot be unrolled, an empty batch, a surrogate's second derivative): "not applicable",
    which does not make a report not ok."""


class NotCheckedError(Exception):
    """Raised inside a check the kit could not run for lack of what it needs (the gradient an
    unknown backward mode must give, a tolerance it cannot set): "skipped", which makes a
    report not ok unless the caller accepts it (``allow_skips``). The message names what
    would let the check run."""


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
        status: "passed", "failed", "skipped" (not checked) or "not applicable".
        measured: the numbers the check measured (e.g. ``rel_error``, ``tol``).
        detail: why it failed, was skipped or does not apply ("" when it passed).
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
        allow_skips: the skipped checks the caller accepted: True (every one), or check names
            (``"gradient_relation"`` accepts ``"gradient_relation[...]"`` on every problem).
    """

    plugin: str
    results: list[CheckResult] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    allow_skips: AllowSkips = False

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
        """The checks the kit could not run (accepted or not)."""
        return [r for r in self.results if r.status == SKIPPED]

    @property
    def not_applicable(self) -> list[CheckResult]:
        """The checks whose premise is absent by design."""
        return [r for r in self.results if r.status == NOT_APPLICABLE]

    @property
    def unchecked(self) -> list[CheckResult]:
        """The skipped checks the caller did not accept (``allow_skips``)."""
        return [r for r in self.skipped if not self._accepted(r.check)]

    @property
    def ok(self) -> bool:
        """Whether everything was checked and right: no check failed, and every skipped check
        was accepted by ``allow_skips``."""
        return not self.failed and not self.unchecked

    def _accepted(self, check: str) -> bool:
        allowed = self.allow_skips
        if isinstance(allowed, bool):
            return allowed
        return check in allowed or check.split("[", 1)[0] in allowed

    def worst(self, check: str, number: str) -> float | None:
        """The largest value of ``measured[number]`` over the passed/failed runs of ``check``."""
        values = [
            r.measured[number] for r in self.results if r.check == check and number in r.measured
        ]
        return max(values) if values else None

    def raise_if_failed(self) -> None:
        """Raise ``ConformanceError`` unless ``ok``: listing every failed check and every
        skipped check ``allow_skips`` did not accept."""
        if self.failed:
            lines = [r.describe(self.plugin) for r in self.failed]
            unchecked = f" and {len(self.unchecked)} not checked" if self.unchecked else ""
            raise ConformanceError(
                f"{len(lines)} conformance check(s) failed{unchecked}:\n"
                + "\n".join(lines + [r.describe(self.plugin) for r in self.unchecked])
            )
        if self.unchecked:
            raise ConformanceError(self.unchecked_message())

    def unchecked_message(self) -> str:
        """What was not checked and how to check it, or to accept it explicitly."""
        names = ", ".join(map(repr, sorted({r.check.split("[", 1)[0] for r in self.unchecked})))
        lines = [r.describe(self.plugin) for r in self.unchecked]
        return (
            f"{len(lines)} conformance check(s) could not run, so the plug-in is not shown to "
            f"conform:\n" + "\n".join(lines) + "\nGive the kit what each one names, or accept "
            f"them explicitly: allow_skips={{{names}}} (or allow_skips=True)."
        )

    def failures_by_check(self) -> dict[str, list[str]]:
        """``{check: [problems it failed on]}``, in the order the checks ran."""
        return _by_check(self.failed)

    def summary(self) -> str:
        """A short account: the counts, then each failed, skipped and not-applicable check
        with the problems and its first message (``details()`` has every check)."""
        head = (
            f"{self.plugin}: {len(self.results)} checks, {len(self.passed)} passed, "
            f"{len(self.failed)} failed, {len(self.skipped)} skipped (not checked), "
            f"{len(self.not_applicable)} not applicable; ok={self.ok}"
        )
        accepted = [r for r in self.skipped if self._accepted(r.check)]
        groups = (
            ("failures by check:", self.failed),
            (
                "not checked (ok is False until they run or allow_skips accepts them):",
                self.unchecked,
            ),
            ("not checked, accepted by allow_skips:", accepted),
            ("not applicable (by design):", self.not_applicable),
        )
        lines = [head]
        for title, results in groups:
            if results:
                lines.append(title)
            for check, problems in _by_check(results).items():
                first = next(r for r in results if r.check == check)
                lines.append(f"  {check}: {len(problems)} ({_per_problem(problems)})")
                lines.append(f"    first: {first.describe(self.plugin)}")
        return "\n".join(lines)

    def details(self) -> str:
        """Every check, one line each, in the order they ran."""
        return "\n".join(r.describe(self.plugin) for r in self.results)


class Checker:
    """Runs checks for one plug-in, recording each outcome in a ``ConformanceReport``.

    Args:
        plugin: the plug-in's description (its repr).
        fail_fast: raise ``ConformanceError`` at the first failure, and at ``finish`` for a
            skipped check ``allow_skips`` does not accept (else collect them all).
        allow_skips: the skipped checks the caller accepts (``ConformanceReport``).
    """

    def __init__(self, plugin: str, fail_fast: bool, allow_skips: AllowSkips = False) -> None:
        if not isinstance(allow_skips, bool):
            if isinstance(allow_skips, str):
                allow_skips = [allow_skips]
            allow_skips = frozenset(allow_skips)
        self.report = ConformanceReport(plugin, allow_skips=allow_skips)
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
            except NotApplicableError as absent:
                result = CheckResult(check, problem, NOT_APPLICABLE, detail=str(absent))
            except NotCheckedError as skip:
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
        """The report; logs a one-line summary. With ``fail_fast``, a skipped check that
        ``allow_skips`` does not accept raises ``ConformanceError`` naming it."""
        report = self.report
        logger.info(
            "%s: %d passed, %d failed, %d skipped, %d not applicable",
            report.plugin,
            len(report.passed),
            len(report.failed),
            len(report.skipped),
            len(report.not_applicable),
        )
        if self.fail_fast and report.unchecked:
            raise ConformanceError(report.unchecked_message())
        return report


def _by_check(results: list[CheckResult]) -> dict[str, list[str]]:
    """``{check: [problems]}`` of ``results``, in the order the checks ran."""
    out: dict[str, list[str]] = {}
    for r in results:
        out.setdefault(r.check, []).append(r.problem)
    return out


def _per_problem(problems: list[str]) -> str:
    return ", ".join(
        name if problems.count(name) == 1 else f"{name} x{problems.count(name)}"
        for name in dict.fromkeys(problems)
    )


def _fmt(value: float) -> str:
    return f"{value:.3e}" if isinstance(value, float) else str(value)
