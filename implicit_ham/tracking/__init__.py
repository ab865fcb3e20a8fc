"""Experiment tracking: sinks for metrics and tables (files, wandb, console) behind one interface.

``Sink.log(metrics, step)``, ``Sink.log_table(name, rows, step=None)``, ``Sink.close()``;
``MultiSink`` fans out to several. ``default_sinks`` builds the usual set: JSONL and CSV files
always, the console optionally, wandb when a project is named. ``wandb`` and ``rich`` are
imported only when their sink is created.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .base import MultiSink, Sink, plain_metrics, plain_value
from .console import ConsoleSink
from .files import CsvFile, CSVSink, JSONLSink, read_jsonl, safe_name
from .wandb_sink import WandbSink


def default_sinks(
    directory: str | Path,
    *,
    wandb_project: str | None = None,
    wandb_group: str | None = None,
    wandb_tags: Sequence[str] = (),
    config: Any = None,
    console: bool = True,
    total_steps: int | None = None,
    **wandb_kwargs: Any,
) -> MultiSink:
    """JSONL + CSV files under ``directory``; a console sink when ``console``; a wandb sink
    (``dir=directory``, offline without an API key) when ``wandb_project`` is given."""
    sinks: list[Sink] = [JSONLSink(directory), CSVSink(directory)]
    if console:
        sinks.append(ConsoleSink(total_steps))
    if wandb_project is not None:
        wandb_kwargs.setdefault("dir", directory)
        sinks.append(
            WandbSink(
                wandb_project, group=wandb_group, tags=wandb_tags, config=config, **wandb_kwargs
            )
        )
    return MultiSink(sinks)


__all__ = [
    "CSVSink",
    "ConsoleSink",
    "CsvFile",
    "JSONLSink",
    "MultiSink",
    "Sink",
    "WandbSink",
    "default_sinks",
    "plain_metrics",
    "plain_value",
    "read_jsonl",
    "safe_name",
]
