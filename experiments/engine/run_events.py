"""The library's warning events of one training run, for ``results.json`` and the sweep report.

The library counts every ``ConvergenceWarning`` / ``NotFixedPointWarning`` /
``ConditioningWarning`` in the process's event ledger (``implicit_ham.diagnostics.events()``)
and shows only a few of them. ``RunEvents`` gives a run its share of that ledger: the counts
since the run started (the ledger is process-wide and may hold earlier runs' events) plus the
counts of the earlier segments of a resumed run (carried per rank in the checkpoint). While it
is active, every implicit layer's forward is an ``event_source`` scope named after the layer,
so forward-solve events are counted per layer; events raised outside a layer's forward (the
backward solves) keep the ledger's own source (e.g. "implicit backward").
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from contextlib import AbstractContextManager
from typing import Any

from torch import nn
from torch.utils.hooks import RemovableHandle

from implicit_ham.adjoints.layers import find_implicit_layers
from implicit_ham.diagnostics import event_source, events

Counts = dict[str, dict[str, int]]  # {source: {kind: events}}


def _add(total: Counter[tuple[str, str]], counts: Mapping[str, Mapping[str, int]]) -> None:
    for source, kinds in counts.items():
        for kind, n in kinds.items():
            total[(str(source), str(kind))] += int(n)


def _nested(total: Counter[tuple[str, str]]) -> Counts:
    out: Counts = {}
    for (source, kind), n in sorted(total.items()):
        if n:
            out.setdefault(source, {})[kind] = n
    return out


class RunEvents:
    """This run's ledger counts, per layer where known.

    Args:
        model: the (unwrapped) model whose implicit layers become event sources.
    """

    def __init__(self, model: nn.Module) -> None:
        self._baseline: Counter[tuple[str, str]] = Counter()
        _add(self._baseline, events().counts())
        self._restored: Counter[tuple[str, str]] = Counter()
        self._handles: list[RemovableHandle] = []
        self._scopes: list[AbstractContextManager[None]] = []
        for name, layer in find_implicit_layers(model).items():
            self._handles.append(layer.register_forward_pre_hook(self._enter(name)))
            self._handles.append(layer.register_forward_hook(self._exit, always_call=True))

    def restore(self, counts: Mapping[str, Mapping[str, int]]) -> None:
        """Add ``counts()`` of the run's earlier segments (this rank's, from the checkpoint)."""
        self._restored = Counter()
        _add(self._restored, counts)

    def _enter(self, name: str) -> Any:
        def hook(module: nn.Module, args: Any) -> None:
            scope = event_source(name)
            scope.__enter__()
            self._scopes.append(scope)

        return hook

    def _exit(self, module: nn.Module, args: Any, output: Any) -> None:
        if self._scopes:
            self._scopes.pop().__exit__(None, None, None)

    def counts(self) -> Counts:
        """``{source: {kind: events}}`` of the whole run (earlier segments included)."""
        total = Counter(self._restored)
        _add(total, events().counts())
        total.subtract(self._baseline)
        return _nested(total)

    def close(self) -> None:
        """Remove the layer hooks."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()


def events_summary(per_rank: Iterable[Mapping[str, Mapping[str, int]]]) -> dict[str, Any]:
    """``{"total", "by_kind": {kind: n}, "by_source": {source: {kind: n}}}`` summed over the
    ranks' ``RunEvents.counts()`` (JSON-ready)."""
    total: Counter[tuple[str, str]] = Counter()
    for counts in per_rank:
        _add(total, counts)
    by_kind: Counter[str] = Counter()
    for (_, kind), n in total.items():
        by_kind[kind] += n
    return {
        "total": sum(by_kind.values()),
        "by_kind": dict(sorted(by_kind.items())),
        "by_source": _nested(total),
    }
