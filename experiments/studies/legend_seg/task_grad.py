"""The task-loss gradient tables of ``docs/results.md`` (``results.json["task_grad"]`` of
``experiments.grad_study``, see ``experiments.studies.task_gradients``), rendered by
``templates/study/task_grad.md.j2``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from experiments.reports.render import Table, fixed
from experiments.studies.legend_seg.data import REFERENCE_K
from experiments.studies.task_gradients import PAPER_ONE_STEP, THROUGH_BASES


@dataclass(frozen=True)
class Pair:
    """At K = ``REFERENCE_K``, one study's cosine to BPTT of the paper's one-step and of the
    one-step through the bases, and BPTT's gradient norm over the paper's one-step's."""

    study: str
    paper: float | None
    through_bases: float | None
    norm_ratio: float | None


@dataclass(frozen=True)
class TaskGradients:
    """The cosine table (one row per study and mode; cells over ``ks``) and the pairs compared
    at ``k``; ``table`` is empty when no study has task-loss gradients."""

    task: str
    ks: tuple[int, ...]
    table: Table
    pairs: tuple[Pair, ...]
    k: int


def task_gradients(studies: Mapping[str, Mapping[str, Any] | None], task: str) -> TaskGradients:
    """``studies``: study label (e.g. "nmf (init)") -> results.json content or None; ``task``:
    how the document names the studies' task and models."""
    body: list[list[Any]] = []
    ks: list[int] = []
    pairs: list[Pair] = []
    for name, res in studies.items():
        rows = (res or {}).get("task_grad") or []
        if not rows:
            continue
        ks = sorted({r["K"] for r in rows} | set(ks))
        for mode in dict.fromkeys(r["mode"] for r in rows):
            mine = sorted((r for r in rows if r["mode"] == mode), key=lambda r: r["K"])
            body.append([name, mode, over_k(mine, "cosine_same_k"), over_k(mine, "cosine")])
        at_k = {r["mode"]: r for r in rows if r["K"] == REFERENCE_K}
        if PAPER_ONE_STEP in at_k and THROUGH_BASES in at_k and "unroll" in at_k:
            pairs.append(Pair(name, at_k[PAPER_ONE_STEP].get("cosine_same_k"),
                              at_k[THROUGH_BASES].get("cosine_same_k"),
                              _ratio(at_k["unroll"], at_k[PAPER_ONE_STEP])))  # fmt: skip
    header = ["study", "backward", "cosine to BPTT at K", "cosine to reference"]
    return TaskGradients(task, tuple(ks), Table.of(header, body), tuple(pairs), REFERENCE_K)


def over_k(rows: Iterable[Mapping[str, Any]], column: str) -> str:
    """``column`` of each row (one per K) with three decimals ("–" where missing), joined by
    " / ": a cell of the cosine tables."""
    return " / ".join(fixed(r.get(column)) for r in rows)


def _ratio(a: Mapping[str, Any], b: Mapping[str, Any]) -> float | None:
    """``a["grad_norm"] / b["grad_norm"]`` (None when either is missing or b's is 0)."""
    num, den = a.get("grad_norm"), b.get("grad_norm")
    return num / den if num is not None and den else None
