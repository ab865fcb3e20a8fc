"""Section 3 of ``docs/results.md``: gradient conditioning, BPTT norms and cosines vs K, and
the remedies for NMF's singular I - J (the ``grad`` studies and the ``remedy`` sweep). Rendered
by ``templates/study/gradients.md.j2``."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from experiments.reports.render import Table
from experiments.reports.sweep_jobs import Row
from experiments.studies.legend_seg.data import (
    CONTEXTS,
    METRICS,
    REFERENCE_K,
    STRESS_TASK,
    Figures,
    StudyRuns,
    TrainedFrom,
    failure_fraction,
    first_config,
    fmt,
    k_steps,
    mean_std,
    pct,
    select,
    trained_from,
)
from experiments.studies.legend_seg.plots import plot_grad_study
from experiments.studies.legend_seg.task_grad import TaskGradients, over_k, task_gradients

REMEDY_MODES = ("implicit", "implicit(ridge=0.1)")
GRAD_CONTEXTS = (*CONTEXTS, "nmf_normalized")
POINTS = ("init", "trained")
WIDE = 10  # a norm ratio over K above this is listed in the summary


@dataclass(frozen=True)
class Best:
    """The best remedy arm by blob accuracy: its ham and ridge λ (the sweep's override) and
    its mean ± std."""

    context: str
    ridge: str
    blob_acc: str


@dataclass(frozen=True)
class Remedy:
    """The remedies subsection: conditioning and cosines at initialisation (``conditioning``,
    at ``k``), the ``remedy`` sweep's table (trained at ``trained_k``, ``seeds`` per arm), the
    best arm, the unremedied baseline's and BPTT's blob accuracy (``ran``: the sweep has jobs;
    ``best`` is None when none succeeded)."""

    conditioning: Table
    k: int
    ran: bool
    trained_k: Any
    seeds: str
    table: Table
    best: Best | None
    baseline: str
    unroll: str


@dataclass(frozen=True)
class Norms:
    """BPTT's gradient norm over K per (ham, model): the table, the spread (smallest and
    largest ratio over the rows), the rows above ``WIDE``, and which rows swing (are not
    monotone in K) or are monotone."""

    ks: tuple[int, ...]
    table: Table
    spread: tuple[float, float] | None
    wide: tuple[tuple[str, float], ...]
    wide_limit: int
    swinging: tuple[str, ...]
    steady: tuple[str, ...]


@dataclass(frozen=True)
class Closer:
    """At K = ``k``, the (ham, model) studies whose one-step gradient is closer (cosine) to the
    reference than BPTT's by at least ``TIE``, those within ``TIE`` of it (``ties``), out of
    ``pairs`` studies with both. The one-step here differentiates through the whole state
    (D, C) of one image at one seed: the through-bases variant, not the paper's one-step."""

    k: int
    studies: tuple[str, ...]
    pairs: int
    ties: tuple[str, ...] = ()


@dataclass(frozen=True)
class Gradients:
    """Section 3. ``ran``: the grad studies exist (the other fields but ``remedy`` are empty
    without); ``trained``: the job behind the trained models; ``one_step_k1``: (lowest,
    highest) cosine of the raw-problem one-step to BPTT at the smallest K and that K."""

    task: str
    ran: bool
    trained: TrainedFrom
    one_step_k1: tuple[float, float, int] | None
    conditioning: Table
    norms: Norms | None
    cosines: Table
    figures: tuple[tuple[str, str], ...]
    task_grad: TaskGradients | None
    closer: Closer | None
    remedy: Remedy


def gradients(runs: StudyRuns, figures: Figures) -> Gradients:
    """Section 3 from the ``grad`` studies and the ``remedy`` sweep (writes the figures)."""
    remedy = _remedy(runs)
    grad = runs.studies.get("grad", {})
    if not grad:
        return Gradients(STRESS_TASK, False, TrainedFrom(), None, Table.of((), ()), None,
                         Table.of((), ()), (), None, None, remedy)  # fmt: skip
    trained = trained_from(runs, [res for name, res in grad.items() if name.startswith("trained")])
    task = f"{STRESS_TASK} (init and {trained.mode_name or '?'}-trained seed {trained.seed or '?'})"
    links = []
    for context in GRAD_CONTEXTS:
        results = {p: runs.study("grad", p, context) for p in POINTS}
        if any(results.values()):
            name = f"q2_grad_{context}.png"
            plot_grad_study(results, context, figures.path(name))
            links.append((context, figures.link(name)))
    studies = {f"{c} ({p})": runs.study("grad", p, c) for c in CONTEXTS for p in POINTS}
    return Gradients(
        task=STRESS_TASK,
        ran=True,
        trained=trained,
        one_step_k1=_one_step_k1(grad.values()),
        conditioning=_conditioning(runs),
        norms=_norms(runs),
        cosines=_cosines(runs),
        figures=tuple(links),
        task_grad=task_gradients(studies, task),
        closer=_closer(runs),
        remedy=remedy,
    )


def _studies(
    runs: StudyRuns, contexts: Sequence[str] = GRAD_CONTEXTS
) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(ham, model, results) of each grad study of ``contexts`` that ran, in the page's order."""
    for context in contexts:
        for point in POINTS:
            if res := runs.study("grad", point, context):
                yield context, point, res


def _conditioning(runs: StudyRuns) -> Table:
    body = []
    for context, point, res in _studies(runs):
        for row in res.get("conditioning", []):
            body.append([context, point, row["point"], row["steps"],
                         row.get("fixed_point_residual"), row.get("spectral_radius"),
                         row.get("sigma_min"), _kappa(row)])  # fmt: skip
    header = ["ham", "model", "state", "iterations", "rel. residual", "spectral radius",
              "σ_min(I − J)", "κ(I − J) ≥"]  # fmt: skip
    return Table.of(header, body)


def _norms(runs: StudyRuns) -> Norms:
    norms: list[tuple[str, str, dict[int, Any]]] = []
    ks: list[int] = []
    for context, point, res in _studies(runs):
        unroll = [r for r in res["grad_vs_k"] if r["adjoint"] == "unroll"]
        by_k = {r["K"]: r.get("grad_norm") for r in unroll}
        norms.append((context, point, by_k))
        ks = sorted(set(ks) | set(by_k))
    ratios = [_ratio(by_k, ks) for *_, by_k in norms]
    body = [[context, point, *(by_k.get(k) for k in ks), ratio]
            for (context, point, by_k), ratio in zip(norms, ratios, strict=True)]  # fmt: skip
    present = [r for r in ratios if r is not None]
    swinging: list[str] = []
    steady: list[str] = []
    for context, point, by_k in norms:
        values = [by_k[k] for k in ks if by_k.get(k) is not None]
        steps = [b - a for a, b in itertools.pairwise(values)]
        monotone = all(d >= 0 for d in steps) or all(d <= 0 for d in steps)
        (steady if monotone else swinging).append(f"{context} ({point})")
    return Norms(
        ks=tuple(ks),
        table=Table.of(["ham", "model", *(f"K={k}" for k in ks), "ratio"], body),
        spread=(min(present), max(present)) if present else None,
        wide=tuple(
            (f"{context} ({point})", r)
            for (context, point, _), r in zip(norms, ratios, strict=True)
            if r is not None and r > WIDE
        ),
        wide_limit=WIDE,
        swinging=tuple(swinging),
        steady=tuple(steady),
    )


def _cosines(runs: StudyRuns) -> Table:
    body = []
    for context, point, res in _studies(runs):
        for mode in dict.fromkeys(r["adjoint"] for r in res["grad_vs_k"]):
            rows = [r for r in res["grad_vs_k"] if r["adjoint"] == mode]
            cells = [over_k(rows, "cosine_same_k"), over_k(rows, "cosine")]
            body.append([context, point, mode, *cells])
    header = ["ham", "model", "backward", "cosine to BPTT at K", "cosine to reference"]
    return Table.of(header, body)


def _one_step_k1(studies: Any) -> tuple[float, float, int] | None:
    """The raw-problem one-step's cosine to BPTT at the smallest K of the studies (lowest,
    highest, K), or None without one-step rows."""
    rows = [r for res in studies for r in (res or {}).get("grad_vs_k", [])
            if r["adjoint"] == "one_step" and r.get("cosine_same_k") is not None]  # fmt: skip
    if not rows:
        return None
    k = min(r["K"] for r in rows)
    values = [r["cosine_same_k"] for r in rows if r["K"] == k]
    return min(values), max(values), k


TIE = 1e-3  # cosines closer than this count as a tie (the page prints three decimals)


def _closer(runs: StudyRuns) -> Closer | None:
    closer, ties, pairs = [], [], 0
    for context, point, res in _studies(runs, CONTEXTS):
        at_k = {r["adjoint"]: r.get("cosine") for r in res.get("grad_vs_k", [])
                if r["K"] == REFERENCE_K}  # fmt: skip
        if at_k.get("unroll") is None or at_k.get("one_step") is None:
            continue
        pairs += 1
        if abs(at_k["one_step"] - at_k["unroll"]) < TIE:
            ties.append(f"{context} ({point})")
        elif at_k["one_step"] > at_k["unroll"]:
            closer.append(f"{context} ({point})")
    return Closer(REFERENCE_K, tuple(closer), pairs, tuple(ties)) if pairs else None


def _remedy(runs: StudyRuns) -> Remedy:
    conditioning = _remedy_conditioning(runs)
    rows = runs.rows("remedy")
    trained_k = first_config(runs.sweeps.get("remedy", [])).get("context", {}).get("steps")
    body, scored = [], []
    for context in ("nmf", "nmf_normalized"):
        for ridge in ("0.0", "0.1", "1.0"):
            row = select(rows, context=context, **{"adjoint.ridge": ridge})
            stats = [mean_std(row, m) for m in METRICS]
            body.append([context, ridge, *map(fmt, stats), pct(failure_fraction(row))])
            if stats[0] is not None and (context, ridge) != ("nmf", "0.0"):
                scored.append((stats[0], context, ridge))  # plain NMF, λ = 0: the baseline
    unroll = mean_std(
        select(runs.rows("adjoints"), context="nmf", adjoint="unroll", **k_steps(REFERENCE_K)),
        "val/blob_acc",
    )
    baseline = mean_std(select(rows, context="nmf", **{"adjoint.ridge": "0.0"}), "val/blob_acc")
    best = max(scored, key=lambda item: item[0][0]) if scored else None
    return Remedy(
        conditioning=conditioning,
        k=REFERENCE_K,
        ran=bool(rows),
        trained_k=trained_k,
        seeds=_seeds(rows),
        table=Table.of(["ham", "ridge λ", *METRICS, "backward missed tol"], body),
        best=None if best is None else Best(best[1], best[2], fmt(best[0])),
        baseline=fmt(baseline),
        unroll=fmt(unroll),
    )


def _remedy_conditioning(runs: StudyRuns) -> Table:
    """NMF vs unit-norm-bases NMF at initialisation: conditioning after the reference
    iterations and the implicit gradients' cosine to BPTT at K = REFERENCE_K."""
    body = []
    for context in ("nmf", "nmf_normalized"):
        res = runs.study("grad", "init", context)
        if not res:
            continue
        rows = res.get("conditioning", [])
        conv: dict[str, Any] = next((r for r in rows if r["point"] == "converged"), {})
        at_k = {r["adjoint"]: r for r in res["grad_vs_k"] if r["K"] == REFERENCE_K}
        cosines = [at_k.get(mode, {}).get("cosine_same_k") for mode in REMEDY_MODES]
        body.append([context, conv.get("spectral_radius"), conv.get("kappa"), *cosines])
    header = ["ham", "spectral radius", "κ(I − J) ≥", *(f"cosine {m}" for m in REMEDY_MODES)]
    return Table.of(header, body)


def _kappa(row: Mapping[str, Any]) -> Any:
    """κ(I − J), "∞" when σ_min is 0 (results.json stores the infinity as null)."""
    if row.get("kappa") is None and row.get("sigma_min") == 0:
        return "∞"
    return row.get("kappa")


def _ratio(by_k: Mapping[int, float | None], ks: Sequence[int]) -> float | None:
    """Spread of the gradient norm over K: largest over smallest (of those > 0)."""
    present = [v for k in ks if (v := by_k.get(k))]
    if len(present) < 2:
        return None
    return max(present) / min(present)


def _seeds(rows: Sequence[Row]) -> str:
    counts = {len(row.jobs) for row in rows}
    return " / ".join(map(str, sorted(counts))) or "0"
