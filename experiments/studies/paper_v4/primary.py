"""Study v4's primary comparisons: each ham's one-step − BPTT at the paper's settings (test
mIoU, paired by replicate), its verdict (``MARGIN``, Holm over the 3 hams,
``experiments.reports.verdicts``), its side of 0, the paper's effect and the collapsed runs;
with the helpers that read an arm's scores from the rows and format an interval.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from experiments.reports.render import Table, fixed
from experiments.reports.verdicts import (
    Interval,
    holm,
    holm_verdict,
    p_value,
    paired_interval,
    verdict,
)
from experiments.studies.paper_v4.jobs import BPTT, HAMS, NO_GRADIENT, ONE_STEP, Job
from experiments.studies.paper_v4.plan import MARGIN, PAPER_EFFECT, Plan, Rows
from experiments.studies.paper_v4.power import paired_sd

PENDING = "pending"


def fmt_value(value: float | None, sign: bool = False, digits: int = 3) -> str:
    """``render.fixed`` of a finite value; "–" for None or a non-finite one."""
    return fixed(value if value is not None and math.isfinite(value) else None, digits, sign)


def fmt_interval(interval: Interval | None, digits: int = 3) -> str:
    """ "+0.004 [−0.006, +0.014] (n=5)" (``digits`` decimals); "–" for None."""
    if interval is None:
        return "–"
    lower, upper = (fmt_value(b, True, digits) for b in (interval.lower, interval.upper))
    return f"{fmt_value(interval.mean, True, digits)} [{lower}, {upper}] (n={interval.n})"


def side_of_zero(interval: Interval) -> str:
    """Where a 95 % interval of a difference lies: "above", "below" or "neither" (spans 0)."""
    return "above" if interval.lower > 0 else "below" if interval.upper < 0 else "neither"


def ok_row(rows: Rows, job: Job) -> Mapping[str, Any] | None:
    row = rows.get(job.key)
    return row if row is not None and row.get("status") == "ok" else None


def arm_scores(rows: Rows, jobs: Sequence[Job], column: str = "test_miou") -> dict[int, float]:
    """replicate -> the finite ``column`` of each ok job."""
    out = {}
    for job in jobs:
        row = ok_row(rows, job)
        if row is not None and row.get(column) is not None and math.isfinite(float(row[column])):
            out[job.replicate] = float(row[column])
    return out


def arm_jobs(jobs: Sequence[Job], context: str, gradient: str, **where: Any) -> list[Job]:
    return [j for j in jobs if (j.context, j.gradient) == (context, gradient)
            and all(getattr(j, k) == v for k, v in where.items())]  # fmt: skip


def collapsed(scores: Mapping[int, float], floor: Mapping[int, float]) -> set[int]:
    """Replicates where an arm scores below the no-context arm (``floor``: replicate -> its
    test mIoU; a replicate without one uses the mean of the others; none at all: no check)."""
    if not floor:
        return set()
    default = statistics.fmean(floor.values())
    return {r for r, v in scores.items() if v < floor.get(r, default)}


def pairs_of(
    a: Mapping[int, float], b: Mapping[int, float], skip: frozenset[int] | set[int] = frozenset()
) -> list[float]:
    return [a[r] - b[r] for r in sorted(a) if r in b and r not in skip]


def interval_of(diffs: Sequence[float]) -> Interval | None:
    return paired_interval(diffs) if diffs else None


@dataclass(frozen=True)
class Primary:
    """One primary comparison: one-step − BPTT at the paper's settings (test mIoU, paired)."""

    ham: str
    interval: Interval | None
    p: float
    holm_p: float
    verdict: str  # after Holm; PENDING until every planned replicate has both arms
    unadjusted: str
    effect: float
    excludes_effect: bool | None
    collapsed_one_step: int
    collapsed_bptt: int
    without_collapses: Interval | None
    complete: bool
    sd: float | None  # the paired differences' SD (None below 2)

    def direction(self) -> str:
        """Where one-step lies against BPTT: "below", "above", "not distinguishable" (the
        interval spans 0), "–" (fewer than 2 replicates)."""
        if self.interval is None or self.interval.n < 2:
            return "–"
        side = side_of_zero(self.interval)
        return "not distinguishable" if side == "neither" else side

    def sentence(self) -> str:
        """The verdict in one line, with its direction, the paper's effect and the
        collapses."""
        where = f"{self.ham.upper()} one-step − BPTT (inv_t 1, K 6)"
        if self.interval is None:
            return f"{where}: no replicate yet; verdict pending"
        effect = f"the paper's +{self.effect:.3f}"
        excluded = (f"excludes {effect}" if self.excludes_effect
                    else f"does not exclude {effect}")  # fmt: skip
        state = (f"{self.verdict} after Holm over 3 (p = {self.p:.3g}, Holm p = "
                 f"{self.holm_p:.3g})" if self.complete
                 else "interim, verdict pending until every planned replicate has run")  # fmt: skip
        collapses = self.collapsed_one_step + self.collapsed_bptt
        note = (f"; {self.collapsed_one_step} one-step and {self.collapsed_bptt} BPTT runs "
                "collapsed below no context (without them: "
                f"{fmt_interval(self.without_collapses)})" if collapses else "")  # fmt: skip
        side = self.direction()
        toward = (f"; one-step lies {side} BPTT (the interval excludes 0)"
                  if side in ("below", "above") else "")  # fmt: skip
        return (f"{where}: {fmt_interval(self.interval)}, {state}{toward}; the interval "
                f"{excluded}{note}.")  # fmt: skip


def primary_comparisons(plan: Plan, rows: Rows, main: Sequence[Job]) -> list[Primary]:
    floor = arm_scores(rows, arm_jobs(main, "none", NO_GRADIENT))
    raw = []
    for ham in HAMS:
        one, ref = (arm_scores(rows, arm_jobs(main, ham, g)) for g in (ONE_STEP, BPTT))
        diffs = pairs_of(one, ref)
        low_one, low_ref = collapsed(one, floor), collapsed(ref, floor)
        raw.append((ham, diffs, low_one, low_ref, pairs_of(one, ref, low_one | low_ref)))
    # the family is fixed at 3: a comparison without data enters Holm with p = 1
    ps = [p_value(d, MARGIN) if len(d) >= 2 else 1.0 for _, d, *_ in raw]
    adjusted = holm(ps)
    out = []
    for (ham, diffs, low_one, low_ref, kept), p, q in zip(raw, ps, adjusted, strict=True):
        interval = interval_of(diffs)
        complete = len(diffs) == plan.replicates
        effect = PAPER_EFFECT[ham]
        excludes = None if interval is None or interval.n < 2 else not (
            interval.lower <= effect <= interval.upper)  # fmt: skip
        out.append(Primary(
            ham, interval, p, q,
            holm_verdict(interval, q, MARGIN) if complete and interval else PENDING,
            verdict(interval, MARGIN) if interval else PENDING,
            effect, excludes, len(low_one), len(low_ref), interval_of(kept), complete,
            paired_sd(diffs),
        ))  # fmt: skip
    return out


def primary_table(primary: Sequence[Primary]) -> Table:
    return Table.of(
        ["ham", "one-step − BPTT, test mIoU [95 % CI]", "verdict (unadjusted)", "p", "Holm p",
         "verdict after Holm", "one-step vs BPTT (interval vs 0)", "paper's effect", "excluded",
         "collapsed (one-step / BPTT)", "without collapsed replicates"],
        [(v.ham.upper(), fmt_interval(v.interval), v.unadjusted,
          f"{v.p:.3g}" if v.interval else "–", f"{v.holm_p:.3g}" if v.interval else "–",
          v.verdict, v.direction(), f"+{v.effect:.3f}",
          "–" if v.excludes_effect is None else ("yes" if v.excludes_effect else "no"),
          f"{v.collapsed_one_step} / {v.collapsed_bptt}", fmt_interval(v.without_collapses))
         for v in primary],
    )  # fmt: skip
