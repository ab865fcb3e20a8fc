"""The public-benchmark page (``docs/benchmarks_public.md``) from the study's CSV: the published
rows with their source, our rows (mean ± sd, per-seed values, epochs run), a one-line verdict
per task with a 95 % interval once every seed of the arms it compares has run, the plan and its
projected cost, and the runner's measured wall time. It renders with no rows or some (saying
which jobs are pending). ``page.md.j2`` beside this file writes it.

    python -m experiments.studies.sequence_benchmarks.report \\
        --csv docs/benchmarks_public/runs.csv --out docs/benchmarks_public.md
"""

from __future__ import annotations

import argparse
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2

from experiments.reports.render import Table, environment
from experiments.studies.paper_v3.table import read_rows, read_sessions
from experiments.studies.sequence_benchmarks.plan import (
    EPOCH_S,
    H3_TASKS,
    Plan,
    add_plan_arguments,
    cost,
    job_cost_s,
    jobs,
    plan_of,
)
from experiments.studies.sequence_benchmarks.run import COLUMNS

Rows = Mapping[str, Mapping[str, Any]]

# Quoted from issue 51 (the lead could not check them against the papers here).
PUBLISHED_H3 = (  # model, induction head, associative recall (% test accuracy)
    ("random", 5.0, 25.0), ("S4D", 35.6, 86.0), ("GSS", 6.8, 78.0), ("H3", 100.0, 99.8),
    ("attention", 100.0, 100.0),
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
# Per task: the verdict's comparison (arm a - arm b, in accuracy points).
VERDICTS = {
    "h3_induction": ("nmf_one_step", "attention"),
    "h3_associative_recall": ("nmf_one_step", "attention"),
    "mnist1d": ("cnn", None),
    "mnist1d_shuffled": ("nmf_one_step", "self_attention"),
}
PUBLISHED_REFERENCE = {"mnist1d": 94.0}  # our CNN against the published CNN
T95 = {1: 12.71, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


@dataclass(frozen=True)
class Page:
    """What the template writes."""

    csv: str
    plan: Plan
    tables: dict[str, Table]
    verdicts: dict[str, str]
    pending: dict[str, int]
    total_jobs: int
    done_jobs: int
    failed: list[str]
    cost: dict[str, float]
    wall_minutes: float | None
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


def interval(values: Sequence[float]) -> tuple[float, float, float] | None:
    """(mean, low, high) of the 95 % t interval of ``values`` (None under two values)."""
    if len(values) < 2:
        return None
    mean, half = statistics.fmean(values), 0.0
    sd = statistics.stdev(values)
    half = T95.get(len(values) - 1, 1.96) * sd / math.sqrt(len(values))
    return mean, mean - half, mean + half


def _table(plan: Plan, rows: Rows, benchmark: str) -> Table:
    arms: list[str] = []
    epochs: dict[str, int] = {}
    for job in jobs(plan):
        if job.benchmark == benchmark and job.arm not in arms:
            arms.append(job.arm)
            epochs[job.arm] = job.epochs
    body = []
    for arm in arms:
        got = _accuracies(rows, benchmark, arm)
        per_seed = ", ".join(f"{a:.1f}" for _, a, _ in got) or "pending"
        ran = ", ".join(str(e) for _, _, e in got) or "—"
        ok = _ok_rows(rows, benchmark, arm)
        times = [float(r["s_per_epoch"]) for r in ok]
        steps = [float(r["forward_steps"]) for r in ok if r.get("forward_steps") not in (None, "")]
        rho = [
            float(r["spectral_radius"]) for r in ok if r.get("spectral_radius") not in (None, "")
        ]
        body.append((
            arm, epochs[arm], mean_sd([a for _, a, _ in got]), per_seed, ran,
            f"{statistics.fmean(times):.1f}" if times else "—",
            f"{statistics.fmean(steps):.1f}" if steps else "—",
            f"{statistics.fmean(rho):.3f}" if rho else "—",
        ))  # fmt: skip
    header = ("arm", "epoch budget", "test acc. % (mean ± sd)", "per seed", "epochs run",
              "s / epoch", "forward steps", "ρ(J) at the end")  # fmt: skip
    return Table.of(header, body)


def _verdict(plan: Plan, rows: Rows, benchmark: str) -> str:
    arm, other = VERDICTS[benchmark]
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
    got = interval(diffs)
    if got is None:
        return f"{what}: {diffs[0]:+.1f} points from one seed (no interval)"
    mean, low, high = got
    verdict = "below" if high < 0 else "above" if low > 0 else "not distinguishable from"
    return (f"{what}: {mean:+.1f} points, 95 % t interval [{low:+.1f}, {high:+.1f}] over "
            f"{len(diffs)} seeds: {verdict} the reference")  # fmt: skip


def build(rows: Rows, plan: Plan, csv: str, sessions: Sequence[Mapping[str, Any]]) -> Page:
    """The page's content from the CSV's rows (any subset of the plan's jobs)."""
    planned = jobs(plan)
    ok = {k for k, r in rows.items() if r["status"] == "ok"}
    pending: dict[str, int] = {}
    for job in planned:
        if job.key not in ok:
            pending[job.benchmark] = pending.get(job.benchmark, 0) + 1
    mine = [s for s in sessions if s.get("plan") == plan.digest()]
    wall = sum(float(s["finished"]) - float(s["started"]) for s in mine) / 60 if mine else None
    times = [(k, f"{float(r['train_s']):.0f}", r["epochs_run"]) for k, r in sorted(rows.items())
             if r["status"] == "ok"]  # fmt: skip
    machines = sorted({f"{r['cpu']}, {r['threads']} thread(s), commit {r['commit']}"
                       for r in rows.values() if r["status"] == "ok"})  # fmt: skip
    return Page(
        csv=csv, plan=plan,
        tables={b: _table(plan, rows, b) for b in plan.benchmarks},
        verdicts={b: _verdict(plan, rows, b) for b in plan.benchmarks},
        pending=pending, total_jobs=len(planned), done_jobs=len(ok & {j.key for j in planned}),
        failed=sorted(k for k, r in rows.items() if r["status"] != "ok"),
        cost=cost(plan), wall_minutes=wall,
        job_times=Table.of(("job", "train s", "epochs run"), times),
        provenance="; ".join(machines) or "no rows yet",
    )  # fmt: skip


def render(page: Page) -> str:
    """The page's markdown."""
    env = environment().overlay(loader=jinja2.FileSystemLoader(str(Path(__file__).parent)))
    return env.get_template("page.md.j2").render(
        doc=page,
        titles=TITLES,
        h3_published=Table.of(("model", "induction head %", "associative recall %"), PUBLISHED_H3),
        mnist_published=Table.of(("model", "MNIST-1D %", "shuffled %"), PUBLISHED_MNIST),
        h3_epochs=H3_TASKS,
        epoch_s=EPOCH_S,
        attention_minutes=sum(job_cost_s(j) for j in jobs(page.plan) if j.arm == "attention")
        / 60
        / 2,
    )


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
