"""Section 2 of ``docs/results.md``, the legend_seg stress test: decomposition x backward mode
over K (the ``adjoints`` sweep), the paper's one-step vs BPTT at the paper's K, and the dD/dX
probe (the ``legend_probe`` sweep). Rendered by ``templates/study/stress.md.j2``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from experiments.reports.render import Table
from experiments.reports.sweep_jobs import Row
from experiments.studies.legend_seg.data import (
    ADJOINTS,
    CONTEXTS,
    KS,
    METRICS,
    REFERENCE_K,
    STRESS_TASK,
    Figures,
    StudyRuns,
    config_value,
    config_with,
    failure_fraction,
    first_config,
    fmt,
    k_steps,
    mean_std,
    pct,
    select,
    target_name,
)
from experiments.studies.legend_seg.plots import plot_metric_vs_k

# Hamburger paper, PASCAL VOC val mIoU (%): (one-step, BPTT); see docs/hamburger.md §3.
PAPER_ONE_STEP_VS_BPTT = {"nmf": (78.3, 77.4), "vq": (77.7, 76.6), "cd": (78.1, 75.0)}
FIGURE = "q1_metrics_vs_k.png"


@dataclass(frozen=True)
class Verdict:
    """The paper's claim one-step >= BPTT at ``k``: the hams where the one-step mean is within
    the larger seed std of BPTT's (``holds``) or below it (``fails``), and each ham's mean
    mIoU difference one-step - BPTT (``gaps``)."""

    k: int
    table: Table
    holds: tuple[str, ...]
    fails: tuple[str, ...]
    gaps: tuple[tuple[str, float], ...]


@dataclass(frozen=True)
class StressTest:
    """Section 2's numbers and settings (None for a setting no job config records).

    Attributes:
        task: the task's name; arch: the model's ``model.arch``.
        ran: whether the ``adjoints`` sweep has jobs; the other fields are empty without.
        phantom: (k, tau) of the phantom arm's ``Phantom``.
        implicit: (linear solver, iterations, tol) of the implicit arm's ``Implicit``.
        on_failure: the implicit arm's ``reliability.on_failure``.
        metrics: (metric, table over K) per metric; missed: the failure-share table.
        figure: the metrics-vs-K figure's link; verdict: at the paper's K (None without rows).
        probe: the dD/dX probe's table (None when ``legend_probe`` is missing), at ``probe_k``.
    """

    task: str
    arch: Any
    ran: bool
    phantom: tuple[Any, Any]
    implicit: tuple[Any, Any, Any]
    on_failure: Any
    metrics: tuple[tuple[str, Table], ...]
    missed: Table
    figure: str
    verdict: Verdict | None
    probe: Table | None
    probe_k: int


def stress_test(runs: StudyRuns, figures: Figures) -> StressTest:
    """Section 2 from the study's ``adjoints`` and ``legend_probe`` sweeps (writes the figure)."""
    rows = runs.rows("adjoints")
    config = first_config(runs.sweeps.get("adjoints", []))
    empty = Table.of((), ())
    if not rows:
        arch = config_value(config, "model.arch")
        return StressTest(STRESS_TASK, arch, False, (None, None), (None, None, None), None, (),
                          empty, "", None, None, REFERENCE_K)  # fmt: skip
    phantom = config_with(rows, "adjoint", adjoint="phantom")
    implicit = config_with(rows, "adjoint", adjoint="implicit")
    ran = [
        k
        for k in KS
        if any(select(rows, context=c, adjoint=a, **k_steps(k)) for c in CONTEXTS for a in ADJOINTS)
    ]
    ks = ran or list(KS)  # columns: the K values the sweep ran (adjoint_ablation: K = 6)
    header = [f"K={k}" for k in ks]
    metrics = tuple(
        (metric, Table.of(["ham", "backward", *header], _metric_rows(rows, metric, ks)))
        for metric in METRICS
    )
    missed = Table.of(
        ["ham", *header],
        (
            [c, *(pct(failure_fraction(select(rows, context=c, adjoint="implicit", **k_steps(k))))
                  for k in ks)]
            for c in CONTEXTS
        ),
    )  # fmt: skip
    plot_metric_vs_k(rows, CONTEXTS, ADJOINTS, ks, METRICS, figures.path(FIGURE))
    return StressTest(
        task=STRESS_TASK,
        arch=config_value(config, "model.arch"),
        ran=True,
        phantom=(config_value(phantom, "adjoint.k"), config_value(phantom, "adjoint.tau")),
        implicit=(
            target_name(implicit, "adjoint.linear_solver"),
            config_value(implicit, "adjoint.max_steps"),
            config_value(implicit, "adjoint.tol"),
        ),
        on_failure=config_value(implicit, "reliability.on_failure"),
        metrics=metrics,
        missed=missed,
        figure=figures.link(FIGURE),
        verdict=_verdict(rows),
        probe=_probe(rows, runs.rows("legend_probe")),
        probe_k=REFERENCE_K,
    )


def _metric_rows(rows: Sequence[Row], metric: str, ks: Sequence[int]) -> list[list[Any]]:
    return [
        [context, adjoint,
         *(fmt(mean_std(select(rows, context=context, adjoint=adjoint, **k_steps(k)), metric))
           for k in ks)]
        for context in CONTEXTS
        for adjoint in ADJOINTS
    ]  # fmt: skip


def _probe(rows: Sequence[Row], probe_rows: Sequence[Row]) -> Table | None:
    """The paper's one-step, the one-step through the last step's bases (``legend_probe``)
    and BPTT at the paper's K, validation mIoU; None without the probe sweep."""
    if not probe_rows:
        return None
    body = []
    for context in CONTEXTS:
        paper = select(rows, context=context, adjoint="one_step", **k_steps(REFERENCE_K))
        bases = select(probe_rows, arm=f"{context}_one_step_bases")
        bptt = select(rows, context=context, adjoint="unroll", **k_steps(REFERENCE_K))
        body.append([context, *(fmt(mean_std(r, "val/miou")) for r in (paper, bases, bptt))])
    return Table.of(["ham", "one-step (paper)", "one-step through the bases", "BPTT"], body)


def _verdict(rows: Sequence[Row]) -> Verdict | None:
    body: list[list[Any]] = []
    holds: list[str] = []
    fails: list[str] = []
    gaps: list[tuple[str, float]] = []
    for context in CONTEXTS:
        one, bptt = (mean_std(select(rows, context=context, adjoint=a, **k_steps(REFERENCE_K)),
                              "val/miou") for a in ("one_step", "unroll"))  # fmt: skip
        if one is None or bptt is None:
            continue
        paper = PAPER_ONE_STEP_VS_BPTT[context]
        diff, noise = one[0] - bptt[0], max(one[1], bptt[1])
        (holds if diff >= -noise else fails).append(context)
        gaps.append((context, diff))
        body.append([context, f"{paper[0]} vs {paper[1]}", fmt(one), fmt(bptt), f"{diff:+.3f}"])
    if not body:
        return None
    header = ["ham", "paper mIoU % (one-step vs BPTT)", "one-step", "BPTT", "difference"]
    return Verdict(REFERENCE_K, Table.of(header, body), tuple(holds), tuple(fails), tuple(gaps))
