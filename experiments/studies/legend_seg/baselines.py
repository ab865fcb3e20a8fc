"""Section 4 of ``docs/results.md``: Hamburger vs attention vs no context on legend_seg (the
``context`` sweep beside the ``adjoints`` sweep's hams at the paper's K), and the compute of the
context modules alone (``bench.json``). Rendered by ``templates/study/baselines.md.j2``."""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from experiments.reports.render import Table
from experiments.reports.sweep_jobs import Row
from experiments.studies.legend_seg.data import (
    ADJOINTS,
    CONTEXTS,
    METRICS,
    REFERENCE_K,
    STRESS_TASK,
    StudyRuns,
    config_value,
    config_with,
    first_config,
    fmt,
    k_steps,
    mean_std,
    select,
)

BASELINE_ARMS = ("none", "sdpa_matched", "self_attention_matched")
BENCH_COLUMNS = ("params_M", "fwd_GF", "train_GF", "fwd_ms", "train_ms", "peak_MiB")


@dataclass(frozen=True)
class Bench:
    """The compute table of ``experiments.bench --json``: its setup (C, r, K, threads, clock),
    the ratio of its largest to its smallest image side (None with one size) and one table per
    side."""

    channels: Any
    rank: Any
    steps: Any
    threads: Any
    clock: Any
    side_ratio: int | None
    tables: tuple[tuple[str, Table], ...]


@dataclass(frozen=True)
class Baselines:
    """Section 4: every arm's parameters, metrics and time (``table``), the attention arms'
    ``context.inner_channels``, the sweep's threads per job and parallel jobs, the compute
    table, and the arms ranked by blob accuracy (name, mean)."""

    task: str
    ran: bool
    table: Table
    inner_channels: Any
    threads: Any
    parallel_jobs: Any
    bench: Bench | None
    ranking: tuple[tuple[str, float], ...]


def baselines(runs: StudyRuns) -> Baselines:
    """Section 4 from the ``context`` and ``adjoints`` sweeps and ``bench.json``."""
    context_rows = runs.rows("context")
    bench = _bench(runs.bench)
    if not context_rows:
        return Baselines(STRESS_TASK, False, Table.of((), ()), None, None, None, bench, ())
    adjoint_rows = runs.rows("adjoints")
    none_params = _param_mean(select(context_rows, arm="none"))
    arms: list[tuple[str, Row | None]] = [
        (arm, select(context_rows, arm=arm)) for arm in BASELINE_ARMS
    ]
    for context in CONTEXTS:
        for adjoint in ADJOINTS:
            row = select(adjoint_rows, context=context, adjoint=adjoint, **k_steps(REFERENCE_K))
            arms.append((f"{context} {adjoint} (K={REFERENCE_K})", row))
    body = []
    for name, row in arms:
        params = _param_mean(row)
        extra = None if params is None or none_params is None else params - none_params
        seconds = mean_std(row, "train_time_s")
        body.append([name, params, extra, *(fmt(mean_std(row, m)) for m in METRICS),
                     None if seconds is None else seconds[0]])  # fmt: skip
    ranked = sorted(
        ((name, s[0]) for name, row in arms if (s := mean_std(row, "val/blob_acc"))),
        key=lambda item: -item[1],
    )
    return Baselines(
        task=STRESS_TASK,
        ran=True,
        table=Table.of(["context", "params", "context params", *METRICS, "train s"], body),
        inner_channels=config_value(
            config_with(context_rows, "context.inner_channels", arm="sdpa_matched"),
            "context.inner_channels",
        ),
        threads=first_config(runs.sweeps.get("context", [])).get("threads"),
        parallel_jobs=runs.parallel_jobs("context"),
        bench=bench,
        ranking=tuple(ranked),
    )


def _bench(bench: Mapping[str, Any] | None) -> Bench | None:
    if not bench:
        return None
    setup = bench.get("setup", {})
    sizes = [size for size in bench if size.isdigit()]
    sides = sorted(int(size) for size in sizes)
    tables = tuple(
        (size, Table.of(["module", *BENCH_COLUMNS], (_bench_row(row) for row in bench[size])))
        for size in sizes
    )
    return Bench(
        **{key: setup.get(key) for key in ("channels", "rank", "steps", "threads", "clock")},
        side_ratio=sides[-1] // sides[0] if len(sides) > 1 and sides[0] else None,
        tables=tables,
    )


def _bench_row(row: Mapping[str, Any]) -> list[Any]:
    return [row["module"], *(row.get(c) for c in BENCH_COLUMNS)]


def _param_mean(row: Row | None) -> float | None:
    values = row.values("parameters") if row is not None else []
    return statistics.fmean(values) if values else None
