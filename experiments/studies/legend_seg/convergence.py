"""Section 5 of ``docs/results.md``: forward convergence of each decomposition and whether a
converged solve helps the trained model (the ``convergence`` studies). Rendered by
``templates/study/convergence.md.j2``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from experiments.reports.render import Table
from experiments.studies.legend_seg.data import (
    CONTEXTS,
    METRICS,
    STRESS_TASK,
    Figures,
    StudyRuns,
    TrainedFrom,
    trained_from,
)
from experiments.studies.legend_seg.plots import plot_convergence, plot_eval_solvers

EFFECT = 0.05  # a blob-accuracy change beyond ± this is called help / hurt
TOL_KEY = "steps_to_"  # results.json's "steps_to_<tol>" column of experiments.convergence


@dataclass(frozen=True)
class Effect:
    """A trained model's blob accuracy at its trained K (``before``) vs the longest plain
    solve (``solver``, ``after``), and the word for the change."""

    context: str
    k: Any
    solver: str
    word: str
    before: float
    after: float


@dataclass(frozen=True)
class Convergence:
    """Section 5 (``ran``: the convergence studies exist). ``tol``: the tolerance of the
    "iterations to tol" column; ``lowest``: (solver, how many (ham, model) cases it has the
    lowest final residual in) and the number of cases; ``trained``: the job behind the trained
    models; ``eval_table`` and ``effects``: the trained models under other forward solvers."""

    task: str
    ran: bool
    tol: float | None
    table: Table
    figure: str
    lowest: tuple[tuple[str, int], ...]
    cases: int
    trained: TrainedFrom
    eval_table: Table
    eval_figure: str
    effects: tuple[Effect, ...]
    effect: float


def convergence(runs: StudyRuns, figures: Figures) -> Convergence:
    """Section 5 from the ``convergence`` studies (writes the figures)."""
    empty = Table.of((), ())
    if not runs.studies.get("convergence"):
        return Convergence(STRESS_TASK, False, None, empty, "", (), 0, TrainedFrom(), empty, "",
                           (), EFFECT)  # fmt: skip
    body, tols = [], set()
    traces: dict[str, dict[str, Any]] = {}
    for context in CONTEXTS:
        traces[context] = {}
        for point in ("init", "trained"):
            res = runs.study("convergence", point, context)
            traces[context][point] = res
            for row in (res or {}).get("convergence", []):
                tol_key = next((k for k in row if k.startswith(TOL_KEY)), None)
                reach = row.get(tol_key) if tol_key else None
                if tol_key:
                    tols.add(float(tol_key[len(TOL_KEY) :]))
                body.append([context, point, row["solver"], row["steps"],
                             row["final_rel_residual"],
                             "never" if reach is not None and reach < 0 else reach,
                             row["contraction"], row.get("objective")])  # fmt: skip
    plot_convergence(traces, figures.path("q4_convergence.png"))
    best = _lowest_residual(traces)
    trained = {c: traces[c].get("trained") for c in CONTEXTS}
    eval_body, effects = [], []
    for context, res in trained.items():
        rows = (res or {}).get("eval_solvers") or []
        eval_body += [[context, row["solver"], row["final_rel_residual"],
                       *(row.get(m) for m in METRICS)] for row in rows]  # fmt: skip
        effect = _effect(context, res, rows)
        if effect is not None:
            effects.append(effect)
    if eval_body:
        plot_eval_solvers(trained, "val/blob_acc", figures.path("q4_eval_solvers.png"))
    header = ["ham", "model", "solver", "iterations", "final rel. residual", "iterations to tol",
              "contraction", "objective"]  # fmt: skip
    return Convergence(
        task=STRESS_TASK,
        ran=True,
        tol=tols.pop() if len(tols) == 1 else None,
        table=Table.of(header, body),
        figure=figures.link("q4_convergence.png"),
        lowest=tuple((name, best.count(name)) for name in dict.fromkeys(best)),
        cases=len(best),
        trained=trained_from(runs, [res for res in trained.values() if res]),
        eval_table=Table.of(["ham", "forward solver", "final rel. residual", *METRICS], eval_body),
        eval_figure=figures.link("q4_eval_solvers.png"),
        effects=tuple(effects),
        effect=EFFECT,
    )


def _effect(context: str, res: Any, rows: Sequence[Mapping[str, Any]]) -> Effect | None:
    """Blob accuracy at the trained K vs the longest plain solve, or None when either is
    missing."""
    k = (res or {}).get("config", {}).get("context", {}).get("eval_steps")
    trained = next((r for r in rows if r["solver"] == f"fixed_point K={k}"), None)
    plain = [r for r in rows if r["solver"].startswith("fixed_point")]
    if trained is None or not plain:
        return None
    longest = max(plain, key=lambda r: int(r["solver"].split("=")[1]))
    before, after = trained.get("val/blob_acc"), longest.get("val/blob_acc")
    if before is None or after is None or longest is trained:
        return None
    delta = after - before
    word = "helps" if delta > EFFECT else "hurts" if delta < -EFFECT else "about the same"
    return Effect(context, k, longest["solver"], word, before, after)


def _lowest_residual(traces: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """For each (ham, model) convergence study, the solver with the lowest final residual."""
    best = []
    for per_point in traces.values():
        for res in per_point.values():
            rows = [r for r in (res or {}).get("convergence", [])
                    if r.get("final_rel_residual") is not None]  # fmt: skip
            if rows:
                best.append(min(rows, key=lambda r: r["final_rel_residual"])["solver"])
    return best
