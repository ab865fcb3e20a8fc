"""The sink interface: where metrics and result tables go (files, wandb, ...).

A sink receives flat metric dicts with a step, and named tables (lists of plain dicts, e.g. the
rows of ``compare_adjoints``). Values are plain Python scalars; ``plain_value`` converts 0-d
tensors and numpy scalars.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any

from torch import Tensor

Scalar = int | float | bool | str | None


def plain_value(value: Any, key: str = "value") -> Scalar:
    """A JSON-friendly scalar from a Python scalar, a one-element tensor or a numpy scalar."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Tensor):
        if value.numel() != 1:
            raise TypeError(
                f"{key}: cannot log a tensor of shape {tuple(value.shape)}; log a scalar "
                "(e.g. its mean or norm)"
            )
        return value.item()
    item = getattr(value, "item", None)
    if callable(item):
        return item()
    raise TypeError(f"{key}: cannot log a {type(value).__name__}; log a number or a string")


def plain_metrics(metrics: Mapping[str, Any]) -> dict[str, Scalar]:
    """``plain_value`` on every entry."""
    return {str(k): plain_value(v, str(k)) for k, v in metrics.items()}


class Sink(ABC):
    """Receives metrics and tables. Use as a context manager or call ``close()``."""

    @abstractmethod
    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        """Record scalar ``metrics`` at training step ``step``."""

    @abstractmethod
    def log_table(
        self, name: str, rows: Sequence[Mapping[str, Any]], step: int | None = None
    ) -> None:
        """Record a table ``name`` (rows: plain dicts; keys may differ between rows)."""

    def close(self) -> None:
        """Flush and release resources (default: nothing to do)."""
        return None

    def __enter__(self) -> Sink:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class MultiSink(Sink):
    """Forwards every call to each of its sinks, in order."""

    def __init__(self, sinks: Iterable[Sink]) -> None:
        self.sinks = list(sinks)

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        for sink in self.sinks:
            sink.log(metrics, step)

    def log_table(
        self, name: str, rows: Sequence[Mapping[str, Any]], step: int | None = None
    ) -> None:
        for sink in self.sinks:
            sink.log_table(name, rows, step)

    def close(self) -> None:
        """Close every sink, even if one of them fails (the first error is re-raised)."""
        errors: list[BaseException] = []
        for sink in self.sinks:
            try:
                sink.close()
            except Exception as err:
                errors.append(err)
        if errors:
            raise errors[0]
