"""Warnings that inform instead of flooding: every warning-worthy event of the library is
counted, and shown rate-limited.

A solver that misses its tolerance or a backward pass taken at a point that is not a fixed
point is usually not a one-off: in training it repeats at every step. Python's default warning
filter shows a message once per location, but the library's messages carry numbers (the
residual), so each would be new. The ledger instead counts every event by kind (the warning
class) and source (the layer, or the problem), and emits:

* the first event of each (kind, source) in full;
* then, at every ``every``-th event of that (kind, source), one summary warning with the
  count since the last one and the worst residual among them.

The active warning filters decide first: under ``"error"`` or ``"always"`` for the category
(``warnings.simplefilter("always", ih.ConvergenceWarning)``, ``pytest.warns``) every event is
emitted; under ``"ignore"`` none is (the counts go on). Every event stays readable:
``ih.diagnostics.events()`` is the process's ledger (``summary()``, ``counts()``, ``reset()``).
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

_SOURCE: ContextVar[str | None] = ContextVar("implicit_ham_event_source", default=None)


@dataclass
class _Tally:
    count: int = 0
    since_report: int = 0
    worst: float | None = None
    worst_since_report: float | None = None


def _worse(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    if b is None:
        return a
    return max(a, b)


def filter_action(category: type[Warning], message: str) -> str:
    """The action of the first active warning filter matching ``category`` and ``message``
    (module and line filters are treated as matching), or "default"."""
    for action, pattern, cat, _module, _lineno in warnings.filters:
        if not issubclass(category, cat):
            continue
        if pattern is not None and not re.compile(pattern).match(message):
            continue
        return str(action)
    return "default"


class EventLedger:
    """Counts events by (kind, source) and emits warnings rate-limited (module docstring).

    Args:
        every: a summary warning every ``every`` events of one (kind, source) after the first.
    """

    def __init__(self, every: int = 100) -> None:
        self.configure(every)
        self._tallies: dict[tuple[str, str], _Tally] = {}

    def configure(self, every: int) -> None:
        """Change the summary period (>= 1)."""
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"EventLedger: every must be an int >= 1, got {every!r}")
        self.every = every

    def warn(
        self,
        message: str,
        category: type[Warning],
        *,
        residual: float | None = None,
        source: str | None = None,
        where: str = "unnamed",
        stacklevel: int = 2,
    ) -> None:
        """Count one event of ``category`` from ``source`` (default: the innermost
        ``event_source`` scope, else ``where``, the reporting site such as the solver's name)
        and emit per the policy."""
        key = (category.__name__, source or _SOURCE.get() or where)
        tally = self._tallies.setdefault(key, _Tally())
        tally.count += 1
        tally.since_report += 1
        tally.worst = _worse(tally.worst, residual)
        tally.worst_since_report = _worse(tally.worst_since_report, residual)
        action = filter_action(category, message)
        if action == "ignore":
            return
        if action in ("error", "always") or tally.count == 1:
            text = message
        elif tally.count % self.every == 0:
            worst = tally.worst_since_report
            text = (
                f"{tally.since_report} more {key[0]} events from {key[1]} since the last report "
                f"({tally.count} in all; worst residual "
                f"{'n/a' if worst is None else f'{worst:.3e}'}); the latest: {message} "
                "[rate-limited: ih.diagnostics.events().summary() has every count; "
                f"warnings.simplefilter('always', {key[0]}) shows each event]"
            )
        else:
            return
        tally.since_report, tally.worst_since_report = 0, None
        warnings.warn(text, category, stacklevel=stacklevel + 1)

    def counts(self) -> dict[str, dict[str, int]]:
        """``{source: {kind: events}}``."""
        out: dict[str, dict[str, int]] = {}
        for (kind, source), tally in sorted(self._tallies.items()):
            out.setdefault(source, {})[kind] = tally.count
        return out

    def summary(self) -> dict[str, Any]:
        """``{"total", "by_kind": {kind: n}, "by_source": {source: {kind: n}},
        "worst_residual": {kind: r}}`` (plain numbers, JSON-ready)."""
        by_kind: dict[str, int] = {}
        worst: dict[str, float | None] = {}
        for (kind, _), tally in self._tallies.items():
            by_kind[kind] = by_kind.get(kind, 0) + tally.count
            worst[kind] = _worse(worst.get(kind), tally.worst)
        return {
            "total": sum(by_kind.values()),
            "by_kind": dict(sorted(by_kind.items())),
            "by_source": self.counts(),
            "worst_residual": dict(sorted(worst.items())),
        }

    def reset(self) -> None:
        """Forget every count (the next event of each kind is shown in full again)."""
        self._tallies.clear()


@contextmanager
def event_source(name: str) -> Iterator[None]:
    """Attribute the events raised in the body to ``name`` (e.g. a layer's qualified name);
    nested scopes: the innermost wins."""
    reset = _SOURCE.set(name)
    try:
        yield
    finally:
        _SOURCE.reset(reset)


_LEDGER = EventLedger()


def events() -> EventLedger:
    """The process's ledger: every event the library's solvers and backward passes report."""
    return _LEDGER
