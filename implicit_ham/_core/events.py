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

Per-layer attribution in plain PyTorch (no ``GuardedStep``): an event's source is, in order,
the ``source`` its reporter names; the label of the autograd node raising it in a backward pass
(``label_events(module, label)`` / ``label_layers`` label the custom autograd Functions a
module's forward creates, e.g. the implicit gradient, so the events of ``loss.backward()`` are
counted per layer); the innermost ``event_source`` scope, which a labelled module's forward
enters too (its forward solves' events); else the reporting site (the solver's name).
"""

from __future__ import annotations

import dataclasses
import re
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar, Token
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from implicit_ham._core.caller import user_stacklevel

_SOURCE: ContextVar[str | None] = ContextVar("implicit_ham_event_source", default=None)
NODE_LABEL = "implicit_ham_event_source"


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
        stacklevel: int | None = None,
    ) -> None:
        """Count one event of ``category`` from ``source`` (default: the label of the autograd
        node running it, else the innermost ``event_source`` scope, else ``where``, the
        reporting site such as the solver's name; see the module docstring) and emit per the
        policy. The warning points at ``stacklevel`` (as for ``warnings.warn``, counted from
        the caller of this method); None (default): the first frame outside this package and
        torch, i.e. the user's call (``user_stacklevel``)."""
        key = (category.__name__, source or _node_label() or _SOURCE.get() or where)
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
        level = user_stacklevel() if stacklevel is None else stacklevel + 1
        warnings.warn(text, category, stacklevel=level)

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


def _node_label() -> str | None:
    """The ``label_events`` label of the autograd node being evaluated (inside a backward
    pass), or None."""
    current = getattr(torch._C, "_current_autograd_node", None)  # absent in old torch: no label
    node = current() if current is not None else None
    if node is None:
        return None
    label = node.metadata.get(NODE_LABEL)
    return label if isinstance(label, str) else None


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    """The tensors in a (nested) tuple / list / dict / dataclass (e.g. a ``Solution``) output or
    input."""
    if isinstance(value, torch.Tensor):
        yield value
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for item in dataclasses.fields(value):
            yield from _tensors(getattr(value, item.name))
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from _tensors(item)
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _tensors(item)


def _label_graph(outputs: Any, label: str, stop: set[Any]) -> int:
    """Label the custom-Function nodes of the graph behind ``outputs`` down to the nodes in
    ``stop`` (the inputs' own nodes) and the leaves; already labelled nodes keep their label
    (the innermost labelled module wins). Returns how many nodes were labelled."""
    pending = [t.grad_fn for t in _tensors(outputs) if t.grad_fn is not None]
    seen: set[Any] = set(stop)
    labelled = 0
    while pending:
        node = pending.pop()
        if node in seen:
            continue
        seen.add(node)
        custom = torch.autograd.function.BackwardCFunction
        if isinstance(node, custom) and NODE_LABEL not in node.metadata:
            node.metadata[NODE_LABEL] = label
            labelled += 1
        pending.extend(n for n, _ in node.next_functions if n is not None and n not in seen)
    return labelled


@dataclass
class EventLabels:
    """The hooks ``label_events`` / ``label_layers`` placed; ``remove()`` takes them off.

    Attributes:
        labels: ``{label: module}`` of the labelled modules.
    """

    labels: dict[str, nn.Module] = field(default_factory=dict)
    handles: list[RemovableHandle] = field(default_factory=list)

    def remove(self) -> None:
        """Remove every hook (nodes already labelled keep their label)."""
        for handle in self.handles:
            handle.remove()
        self.handles.clear()

    def __enter__(self) -> EventLabels:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def label_events(module: nn.Module, label: str) -> EventLabels:
    """Count the events of ``module`` under ``label``, forward and backward, in plain PyTorch.

    While ``module``'s forward runs, its events (a forward solve missing its tolerance) go to
    ``label`` (an ``event_source`` scope); the custom autograd Functions its forward creates
    (the implicit gradient, whose backward checks the fixed point and solves the linear system)
    are labelled, so the events their backward raises go to ``label`` too. Cost: one walk over
    the module's autograd graph per forward with gradient.

    Args:
        module: the layer (or a model: then every event inside it goes to ``label``, unless a
            labelled submodule claims it first).
        label: a non-empty name, e.g. the module's qualified name.

    Returns:
        The ``EventLabels`` handle (``remove()``, or use it as a context manager).
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"label_events: module must be an nn.Module, got {type(module).__name__}")
    if not isinstance(label, str) or not label:
        raise ValueError(f"label_events: label must be a non-empty str, got {label!r}")
    frames: list[tuple[Token[str | None], set[Any]]] = []

    def before(_: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        stop = {t.grad_fn for t in _tensors((args, kwargs)) if t.grad_fn is not None}
        frames.append((_SOURCE.set(label), stop))

    def after(_: nn.Module, args: Any, kwargs: Any, output: Any) -> None:
        if not frames:
            return
        token, stop = frames.pop()
        _SOURCE.reset(token)
        if output is not None and torch.is_grad_enabled():
            _label_graph(output, label, stop)

    handles = [
        module.register_forward_pre_hook(before, with_kwargs=True),
        module.register_forward_hook(after, with_kwargs=True, always_call=True),
    ]
    return EventLabels({label: module}, handles)


def label_layers(layers: Mapping[str, nn.Module]) -> EventLabels:
    """``label_events`` for each ``{label: module}`` (e.g. the implicit layers of a model by
    qualified name: ``ih.diagnostics.attribute_events(model)``); one handle for all."""
    out = EventLabels()
    for label, module in layers.items():
        one = label_events(module, label)
        out.labels.update(one.labels)
        out.handles += one.handles
    return out


_LEDGER = EventLedger()


def events() -> EventLedger:
    """The process's ledger: every event the library's solvers and backward passes report."""
    return _LEDGER
