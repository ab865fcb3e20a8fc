"""The public-benchmark page (``docs/benchmarks_public.md``) from the study's CSV: the published
rows with their source, our rows beside them (mean ± sd, per-seed values, epochs run), the
learning curves with each job's plateau status (``learning_status``), a one-line verdict per
task with a paired 95 % interval once every seed of the arms it compares has run, the checks
against the published rows (attention within 1 point, the MNIST-1D baselines within 3), the
plan's tiers and projected cost, and the measured wall time. It renders with no rows or some
(saying which jobs, and which tiers, are pending). ``page.md.j2`` beside this file writes it.

    python -m experiments.studies.sequence_benchmarks.report \\
        --csv docs/benchmarks_public/runs.csv --out docs/benchmarks_public.md
"""

from __future__ import annotations

import argparse
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from experiments.reports.render import Table, render_beside
from experiments.reports.verdicts import paired_interval
from experiments.studies.csv_rows import decode_curve, read_rows, read_sessions
from experiments.studies.job_costs import fastest
from experiments.studies.sequence_benchmarks.plan import (
    ATTENTION_RUNS,
    ATTENTION_SOLVED_AT,
    BUDGET_MINUTES,
    DEQ_MAX_STEPS,
    EPOCH_S,
    H3_TASKS,
    TIERS,
    Plan,
    TierCost,
    add_plan_arguments,
    cost,
    jobs,
    plan_of,
)
from experiments.studies.sequence_benchmarks.run import COLUMNS

Rows = Mapping[str, Mapping[str, Any]]

# H3: quoted from issue 51 (Table 2 of the paper; not checked against the paper here).
# MNIST-1D: the package's README table (greydanus/mnist1d), checked against it.
PUBLISHED_H3 = (  # model, induction head, associative recall (% test accuracy)
    ("Random", 5.0, 25.0), ("S4D", 35.6, 86.0), ("Gated State Spaces (GSS)", 6.8, 78.0),
    ("H3", 100.0, 99.8), ("Attention", 100.0, 100.0),
)  # fmt: skip
PUBLISHED_MNIST = (  # model, default, shuffled (% test accuracy)
    ("logistic", 32, 32), ("MLP", 68, 68), ("CNN", 94, 56), ("GRU", 91, 57), ("human", 96, "~30"),
)  # fmt: skip
TITLES = {
    "h3_induction": "H3 induction head",
    "h3_associative_recall": "H3 associative recall",
    "mnist1d": "MNIST-1D",
    "mnist1d_shuffled": "MNIST-1D, shuffled",
}
# Per task: the verdict's comparisons (arm a - arm b, in accuracy points; b None: against the
# published row). H3: the Hamburger mixer against the published (causal) attention, and against
# the same attention without the mask (like for like: the Hamburger mixers are bidirectional).
VERDICTS: dict[str, tuple[tuple[str, str | None], ...]] = {
    "h3_induction": (("nmf_one_step", "attention"), ("nmf_one_step", "attention_bidirectional")),
    "h3_associative_recall": (
        ("nmf_one_step", "attention"),
        ("nmf_one_step", "attention_bidirectional"),
    ),
    "mnist1d": (("cnn", None),),
    "mnist1d_shuffled": (("nmf_one_step", "self_attention"),),
}
PUBLISHED_REFERENCE = {"mnist1d": 94.0}  # our CNN against the published CNN
# Our arms that have a published row: {benchmark: {arm: (published %, tolerance in points)}};
# the checks: attention reproduces 100 / 100 within 1 point, the MNIST-1D baselines
# land within 3 points (the shuffled CNN is shown beside its row, with no tolerance).
PUBLISHED_ARMS: dict[str, dict[str, tuple[float, float | None]]] = {
    "h3_induction": {"attention": (100.0, 1.0)},
    "h3_associative_recall": {"attention": (100.0, 1.0)},
    "mnist1d": {"mlp": (68.0, 3.0), "cnn": (94.0, 3.0), "gru": (91.0, 3.0)},
    "mnist1d_shuffled": {"none": (56.0, None)},
}
# Why a check can miss its published row (said beside a miss).
MISMATCH = {
    "h3_induction": "see the deviations from safari in the configuration",
    "h3_associative_recall": "see the deviations from safari in the configuration",
    "mnist1d": "our model is not the package's architecture: see the configuration",
}
PLATEAU_POINTS = 1.0  # a curve gaining less than this over its last quarter has plateaued


@dataclass(frozen=True)
class Page:
    """What the template writes."""

    csv: str
    plan: Plan
    tables: dict[str, Table]
    verdicts: dict[str, str]
    checks: list[str]
    curves: dict[str, Table]
    pending: dict[str, int]
    total_jobs: int
    done_jobs: int
    failed: list[str]
    tiers: Table
    cost: list[TierCost]
    wall_minutes: float | None
    job_minutes: float
    recorded_jobs: int  # jobs run by the invocations the sessions sidecar records
    notes: dict[str, str]  # per benchmark: what its table's numbers do not say (or "")
    measured_minutes: float  # the finished jobs at their arms' fastest measured epochs
    job_times: Table
    provenance: str


def _ok_rows(rows: Rows, benchmark: str, arm: str) -> list[Mapping[str, Any]]:
    """The arm's ``ok`` rows."""
    return [
        r for r in rows.values()
        if r["benchmark"] == benchmark and r["arm"] == arm and r["status"] == "ok"
    ]  # fmt: skip


def _accuracies(rows: Rows, benchmark: str, arm: str) -> list[tuple[int, float, int]]:
    """[(seed, accuracy %, epochs run)] of the arm's ok rows."""
    ok = _ok_rows(rows, benchmark, arm)
    return sorted((int(r["seed"]), 100 * float(r["accuracy"]), int(r["epochs_run"])) for r in ok)


def mean_sd(values: Sequence[float]) -> str:
    """ "m ± sd" (sd only with two or more values; "—" for none)."""
    if not values:
        return "—"
    if len(values) == 1:
        return f"{values[0]:.1f}"
    return f"{statistics.fmean(values):.1f} ± {statistics.stdev(values):.1f}"


def _column_mean(rows: Sequence[Mapping[str, Any]], column: str, digits: int) -> str:
    """The mean of ``column`` over the rows that have it, to ``digits`` decimals ("—": none)."""
    values = [float(r[column]) for r in rows if r.get(column) not in (None, "")]
    return f"{statistics.fmean(values):.{digits}f}" if values else "—"


def _epoch_caps(plan: Plan, benchmark: str) -> dict[str, int]:
    """{arm: epoch cap} of ``benchmark``'s arms, in run order (an arm's seeds share its cap)."""
    return {job.arm: job.epochs for job in jobs(plan) if job.benchmark == benchmark}


def _table(plan: Plan, rows: Rows, benchmark: str) -> Table:
    epochs = _epoch_caps(plan, benchmark)
    body = []
    for arm in epochs:
        got = _accuracies(rows, benchmark, arm)
        per_seed = ", ".join(f"{a:.1f}" for _, a, _ in got) or "pending"
        ran = ", ".join(str(e) for _, _, e in got) or "—"
        ok = _ok_rows(rows, benchmark, arm)
        published = PUBLISHED_ARMS.get(benchmark, {}).get(arm)
        body.append((
            arm, epochs[arm], mean_sd([a for _, a, _ in got]),
            f"{published[0]:.1f}" if published else "—", per_seed, ran,
            _column_mean(ok, "s_per_epoch", 1), _column_mean(ok, "forward_steps", 1),
            _column_mean(ok, "spectral_radius", 3),
        ))  # fmt: skip
    header = ("arm", "epoch cap", "test acc. % (mean ± sd)", "published %", "per seed",
              "epochs run", "s / epoch", "forward steps", "ρ(J) at the end")  # fmt: skip
    return Table.of(header, body)


def fixed_point_note(rows: Rows, benchmark: str) -> str:
    """For a benchmark with DEQ rows (a ``spectral_radius``): how many jobs never reached a
    fixed point (the forward solve used all ``DEQ_MAX_STEPS`` steps on average over training
    and ρ(J) at the end is at least 1) and what that means for the modes that differentiate at
    one; "" without DEQ rows."""
    deq = [r for r in rows.values() if r.get("benchmark") == benchmark and r["status"] == "ok"
           and r.get("spectral_radius") not in (None, "")]  # fmt: skip
    if not deq:
        return ""
    stuck = [r for r in deq if float(r["forward_steps"]) >= DEQ_MAX_STEPS
             and float(r["spectral_radius"]) >= 1]  # fmt: skip
    if not stuck:
        return (f"Fixed points: every one of the {len(deq)} DEQ jobs ended with ρ(J) below 1 or "
                "its forward solve under its step cap.")  # fmt: skip
    rho = [float(r["spectral_radius"]) for r in stuck]
    counted = [int(float(r["failures"])) for r in stuck if r.get("failures") not in (None, "")]
    failures = (f"the engine counted {min(counted)} to {max(counted)} failures per job, by its "
                "policy" if counted else "the engine counts each such step")  # fmt: skip
    return (
        f"Fixed points: in {len(stuck)} of {len(deq)} DEQ jobs the forward solve used all "
        f"{DEQ_MAX_STEPS} of its steps on average over training and ρ(J) at the end is above 1 "
        f"({min(rho):.2f} to {max(rho):.2f}): there the cell has no attracting fixed point, so "
        "the accuracy is that of a 20-step unrolled network, and the modes that differentiate at "
        f"a fixed point (phantom, Neumann, implicit) apply their formula where it does not hold "
        f"({failures}). The spectral norm bounds the convolution only, not the GroupNorm after "
        "it."
    )


def learning_status(curve: Sequence[tuple[int, float]]) -> str:
    """A job's learning curve [(epoch, test accuracy in [0, 1])] in words: "solved at epoch k"
    (it reached 100 %), "plateaued" (the best accuracy of its last quarter of epochs, at least
    2, beats the best before by under ``PLATEAU_POINTS`` points), "rising" (by more), or "too
    short" (under 4 epochs)."""
    if not curve:
        return "no curve"
    solved = [e for e, a in curve if a >= 1.0]
    if solved:
        return f"solved at epoch {solved[0]}"
    if len(curve) < 4:
        return f"too short ({len(curve)} epochs)"
    window = max(2, len(curve) // 4)
    gain = 100 * (max(a for _, a in curve[-window:]) - max(a for _, a in curve[:-window]))
    word = "plateaued" if gain < PLATEAU_POINTS else "rising"
    return f"{word} ({gain:+.1f} in the last {window} epochs)"


def curve_at(curve: Sequence[tuple[int, float]], epoch: int) -> float | None:
    """The accuracy (%) at ``epoch``, or the last one before it (a job that stopped early
    keeps its last value); None for an empty curve."""
    before = [a for e, a in curve if e <= epoch]
    return 100 * before[-1] if before else None


def _curves(plan: Plan, rows: Rows, benchmark: str) -> Table:
    """Per arm: the mean test accuracy over seeds at five epochs of its cap (1, a quarter,
    half, three quarters, the cap) and each seed's ``learning_status``."""
    body = []
    for arm, cap in _epoch_caps(plan, benchmark).items():
        ok = sorted(_ok_rows(rows, benchmark, arm), key=lambda r: int(r["seed"]))
        curves = [decode_curve(r.get("curve")) for r in ok]
        marks = sorted({max(1, cap * q // 4) for q in range(5)})
        points = []
        for epoch in marks:
            values = [v for c in curves if (v := curve_at(c, epoch)) is not None]
            points.append(f"{epoch}: {statistics.fmean(values):.0f}" if values else f"{epoch}: —")
        status = "; ".join(
            f"s{r['seed']} {learning_status(c)}" for r, c in zip(ok, curves, strict=True)
        )
        body.append((arm, ", ".join(points), status or "pending"))
    return Table.of(("arm", "mean test acc. % at epoch", "per seed"), body)


def _checks(plan: Plan, rows: Rows) -> list[str]:
    """One line per published row we hold an arm against (``PUBLISHED_ARMS``)."""
    out = []
    for benchmark, arms in PUBLISHED_ARMS.items():
        if benchmark not in plan.benchmarks:
            continue
        for arm, (published, tolerance) in arms.items():
            got = [a for _, a, _ in _accuracies(rows, benchmark, arm)]
            what = (f"{TITLES[benchmark]}, {arm}: {mean_sd(got)} % against the published "
                    f"{published:.0f} %")  # fmt: skip
            if len(got) < len(plan.seeds):
                out.append(f"{what} (pending: {len(got)} of {len(plan.seeds)} seeds)")
            elif tolerance is None:
                out.append(f"{what} (shown for reference; no tolerance set)")
            else:
                gap = statistics.fmean(got) - published
                word = "within" if abs(gap) <= tolerance else "NOT within"
                why = "" if abs(gap) <= tolerance else f" ({MISMATCH.get(benchmark, 'see above')})"
                out.append(f"{what}: {gap:+.1f} points, {word} {tolerance:.0f}{why}")
    return out


def _verdict(plan: Plan, rows: Rows, benchmark: str) -> str:
    """The task's comparisons (``VERDICTS``), one clause each, joined into one line."""
    return "; ".join(_compare(plan, rows, benchmark, a, b) for a, b in VERDICTS[benchmark])


def _compare(plan: Plan, rows: Rows, benchmark: str, arm: str, other: str | None) -> str:
    mine = {s: a for s, a, _ in _accuracies(rows, benchmark, arm)}
    if other is None:
        reference = PUBLISHED_REFERENCE[benchmark]
        diffs = [a - reference for a in mine.values()]
        what = f"our {arm} − the published CNN ({reference:.0f} %)"
    else:
        theirs = {s: a for s, a, _ in _accuracies(rows, benchmark, other)}
        diffs = [mine[s] - theirs[s] for s in sorted(mine) if s in theirs]
        what = f"{arm} − {other}, paired by seed"
    if len(diffs) < len(plan.seeds):
        return f"pending ({len(diffs)} of {len(plan.seeds)} seeds of {what} have run)"
    if len(diffs) < 2:
        return f"{what}: {diffs[0]:+.1f} points from one seed (no interval)"
    got = paired_interval(diffs)
    mean, low, high = got.mean, got.lower, got.upper
    verdict = "below" if high < 0 else "above" if low > 0 else "not distinguishable from"
    return (f"{what}: {mean:+.1f} points, 95 % t interval [{low:+.1f}, {high:+.1f}] over "
            f"{len(diffs)} seeds: {verdict} the reference")  # fmt: skip


def fastest_minutes(rows: Rows) -> dict[str, float]:
    """Per job key of an ``ok`` row: its epochs run at its arm's fastest measured seconds per
    epoch (over the arm's seeds on that benchmark), in minutes: the job's time at the lowest
    load its arm met (rows ran under different loads; an idle-core figure, still an upper bound
    where every seed of an arm ran under load)."""
    ok = [r for r in rows.values() if r["status"] == "ok"]
    per_arm = fastest(ok, _arm_of, lambda r: float(r["s_per_epoch"]))
    return {str(r["job"]): per_arm[_arm_of(r)] * float(r["epochs_run"]) / 60 for r in ok}


def _arm_of(row: Mapping[str, Any]) -> tuple[str, str]:
    return str(row["benchmark"]), str(row["arm"])


def _tier_table(
    plan: Plan, ok: set[str], projected: Sequence[TierCost], measured: Mapping[str, float]
) -> Table:
    """Per tier: what it holds, jobs done of planned, the projection, the budget and the job
    minutes its finished jobs take at their arms' fastest measured epochs (``measured``)."""
    planned = jobs(plan)
    body = []
    for t in projected:
        mine = [j.key for j in planned if j.tier == t.tier]
        body.append((
            t.tier, TIERS[t.tier], f"{len(ok & set(mine))} of {len(mine)}",
            f"{t.expected:.0f}", f"{t.worst:.0f}", f"{t.ends_at:.0f}",
            "inside" if t.fits else "beyond",
            f"{sum(measured.get(k, 0.0) for k in mine):.0f}",
        ))  # fmt: skip
    header = ("tier", "rows", "jobs done", "projected min", "worst case min", "ends at min",
              f"{BUDGET_MINUTES:.0f}-min budget", "measured job min")  # fmt: skip
    return Table.of(header, body)


def build(rows: Rows, plan: Plan, csv: str, sessions: Sequence[Mapping[str, Any]]) -> Page:
    """The page's content from the CSV's rows (any subset of the plan's jobs)."""
    planned = jobs(plan)
    ok = {k for k, r in rows.items() if r["status"] == "ok"}
    pending = dict(Counter(job.benchmark for job in planned if job.key not in ok))
    mine = [s for s in sessions if s.get("plan") == plan.digest()]
    wall = sum(float(s["finished"]) - float(s["started"]) for s in mine) / 60 if mine else None
    times = [(k, r["stage"], f"{float(r['train_s']):.0f}", r["epochs_run"])
             for k, r in sorted(rows.items()) if r["status"] == "ok"]  # fmt: skip
    projected = cost(plan)
    measured = fastest_minutes(rows)
    machines = sorted({f"{r['cpu']}, {r['threads']} thread(s), commit {r['commit']}"
                       for r in rows.values() if r["status"] == "ok"})  # fmt: skip
    return Page(
        csv=csv, plan=plan,
        tables={b: _table(plan, rows, b) for b in plan.benchmarks},
        verdicts={b: _verdict(plan, rows, b) for b in plan.benchmarks},
        checks=_checks(plan, rows),
        curves={b: _curves(plan, rows, b) for b in plan.benchmarks},
        pending=pending, total_jobs=len(planned), done_jobs=len(ok & {j.key for j in planned}),
        failed=sorted(k for k, r in rows.items() if r["status"] != "ok"),
        tiers=_tier_table(plan, ok, projected, measured), cost=projected, wall_minutes=wall,
        measured_minutes=sum(measured.get(j.key, 0.0) for j in planned),
        recorded_jobs=sum(int(s["jobs_run"]) for s in mine),
        notes={b: fixed_point_note(rows, b) for b in plan.benchmarks},
        job_minutes=sum(float(rows[k]["train_s"]) for k in ok) / 60,
        job_times=Table.of(("job", "tier", "train s", "epochs run"), times),
        provenance="; ".join(machines) or "no rows yet",
    )  # fmt: skip


def render(page: Page) -> str:
    """The page's markdown."""
    return render_beside(
        __file__, "page.md.j2",
        doc=page,
        titles=TITLES,
        h3_published=Table.of(("model", "induction head %", "associative recall %"), PUBLISHED_H3),
        mnist_published=Table.of(("model", "MNIST-1D %", "shuffled %"), PUBLISHED_MNIST),
        h3_epochs=H3_TASKS,
        epoch_s=EPOCH_S,
        solved_at=ATTENTION_SOLVED_AT,
        measured=Table.of(
            (
                "task",
                "mixer",
                "epochs run",
                "best test acc. %",
                "at epoch",
                "final %",
                "reached 100 % at epoch",
                "s / epoch",
            ),
            [
                (
                    TITLES[r.benchmark],
                    r.mixer,
                    r.epochs,
                    f"{100 * r.best:.1f}",
                    r.best_epoch,
                    f"{100 * r.final:.1f}",
                    r.solved_at,
                    r.s_per_epoch,
                )
                for r in ATTENTION_RUNS
            ],
        ),
        budget=BUDGET_MINUTES,
        caps=_caps(page.plan),
    )


def _caps(plan: Plan) -> dict[str, dict[str, int]]:
    """{benchmark: {arm: epoch cap}} of the H3 tasks (the equal-time rule's epochs)."""
    caps = {b: _epoch_caps(plan, b) for b in plan.benchmarks if b in H3_TASKS}
    return {b: arms for b, arms in caps.items() if arms}


def write(csv: str | Path, out: str | Path, plan: Plan | None = None) -> Path:
    """Write the page ``out`` from ``csv`` (absent: no rows yet)."""
    csv = Path(csv)
    rows = read_rows(csv, COLUMNS)
    sessions = read_sessions(csv) if csv.exists() else []
    text = render(build(rows, plan or Plan(), str(csv), sessions))
    Path(out).write_text(text, encoding="utf-8")
    return Path(out)


def main(argv: Sequence[str] | None = None) -> None:
    """Regenerate the page from the CSV."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--csv", default="docs/benchmarks_public/runs.csv")
    parser.add_argument("--out", default="docs/benchmarks_public.md")
    add_plan_arguments(parser)
    args = parser.parse_args(argv)
    print(write(args.csv, args.out, plan_of(args)))


if __name__ == "__main__":
    main()
