"""The ``logger`` config group's targets: each returns the metric sinks of a job.

Called as ``instantiate(cfg.logger, directory=..., config=...)``; the other fields are
generated from the signatures (``experiments.config.signatures``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from experiments.engine.file_sinks import CSVSink, JSONLSink
from experiments.engine.wandb_sink import WandbSink
from implicit_ham.diagnostics import Sink


def no_sinks(directory: str | Path, config: Mapping[str, Any]) -> list[Sink]:
    """Console only (``results.json`` is still written)."""
    return []


def file_sinks(directory: str | Path, config: Mapping[str, Any]) -> list[Sink]:
    """JSONL and CSV metric files in the job's directory."""
    return [JSONLSink(directory), CSVSink(directory)]


def wandb_sinks(
    directory: str | Path,
    config: Mapping[str, Any],
    project: str = "implicit-ham",
    group: str | None = None,
    tags: Sequence[str] = (),
    mode: str | None = None,
) -> list[Sink]:
    """The files plus a wandb run. ``mode`` None: ``WANDB_MODE`` if set, else offline unless
    ``WANDB_API_KEY`` is set (``experiments.engine.wandb_sink.resolve_mode``)."""
    run = WandbSink(
        project, group=group, tags=list(tags), config=dict(config), mode=mode, dir=str(directory)
    )
    return [*file_sinks(directory, config), run]
