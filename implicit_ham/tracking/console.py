"""Console sink: a rich progress bar (or one line per log call) and tables as rich tables."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..diagnostics.table import columns_of, format_value
from .base import Sink, plain_metrics

if TYPE_CHECKING:
    from rich.console import Console


class ConsoleSink(Sink):
    """Shows training progress on the terminal with rich.

    Args:
        total_steps: when given, a progress bar over that many steps whose description shows
            the latest metrics; otherwise each ``log`` prints one line.
        keys: metric keys to show (default: the first ``max_items`` of each call).
        max_items: how many metrics to show when ``keys`` is None.
        console: a ``rich.console.Console`` (default: one writing to stderr).
    """

    def __init__(
        self,
        total_steps: int | None = None,
        *,
        keys: Sequence[str] | None = None,
        max_items: int = 4,
        console: Console | None = None,
    ) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
        )

        self.console = console or Console(stderr=True)
        self.keys = list(keys) if keys is not None else None
        self.max_items = max_items
        self.progress: Progress | None = None
        if total_steps is not None:
            self.progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeRemainingColumn(),
                console=self.console,
            )
            self.task = self.progress.add_task("step", total=total_steps)
            self.progress.start()

    def _summary(self, metrics: Mapping[str, Any]) -> str:
        keys = self.keys if self.keys is not None else list(metrics)[: self.max_items]
        return "  ".join(f"{k}={format_value(metrics[k])}" for k in keys if k in metrics)

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        text = self._summary(plain_metrics(metrics))
        if self.progress is not None:
            self.progress.update(self.task, completed=step + 1, description=text or "step")
        else:
            self.console.print(f"step {step}  {text}")

    def log_table(
        self, name: str, rows: Sequence[Mapping[str, Any]], step: int | None = None
    ) -> None:
        from rich.table import Table

        plain = [plain_metrics(r) for r in rows]
        title = name if step is None else f"{name} (step {step})"
        table = Table(title=title)
        columns = columns_of(plain)
        for column in columns:
            table.add_column(column)
        for row in plain:
            table.add_row(*(format_value(row.get(c)) for c in columns))
        self.console.print(table)

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None
