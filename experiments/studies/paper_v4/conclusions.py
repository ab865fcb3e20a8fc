"""Study v4's conclusions, one line per paper claim (the top of ``docs/results.md`` and of
the findings), and study v3's rows at the paper's settings quoted beside them until v4 is
complete.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from experiments.reports.verdicts import NON_INFERIOR, Interval, verdict
from experiments.studies.paper_v4.jobs import BPTT, HAMS, ONE_STEP
from experiments.studies.paper_v4.plan import MARGIN, PAPER_EFFECT, Plan, Rows
from experiments.studies.paper_v4.primary import (
    Primary,
    fmt_interval,
    interval_of,
    pairs_of,
    side_of_zero,
)


def _is(row: Mapping[str, Any], **wanted: Any) -> bool:
    """Whether ``row`` holds every ``column=value`` of ``wanted``."""
    return all(row.get(k) == v for k, v in wanted.items())


def v3_differences(rows: Rows) -> dict[str, list[float]]:
    """Study v3's paired one-step − BPTT test mIoU per ham at inv_t 1 (NMF: none), K 6, main
    arms, by replicate."""
    out: dict[str, list[float]] = {}
    for ham in HAMS:
        arm: dict[str, dict[int, float]] = {ONE_STEP: {}, BPTT: {}}
        inv_t = 1.0 if ham != "nmf" else None
        for row in rows.values():
            selected = _is(row, stage="main", context=ham, K=6, inv_t=inv_t, status="ok")
            if selected and row.get("gradient") in arm:
                arm[str(row["gradient"])][int(row["replicate"])] = float(row["test_miou"])
        out[ham] = pairs_of(arm[ONE_STEP], arm[BPTT])
    return out


def v3_collapses(rows: Rows) -> dict[tuple[str, float], tuple[int, int]]:
    """Study v3's BPTT main arms (K 6) at inv_t other than 1, per (ham, inv_t): (replicates
    scoring below that replicate's no-context arm, replicates with both rows)."""
    floor = {int(r["replicate"]): float(r["test_miou"]) for r in rows.values()
             if _is(r, stage="main", context="none", status="ok")}  # fmt: skip
    out: dict[tuple[str, float], tuple[int, int]] = {}
    for row in rows.values():
        inv_t = row.get("inv_t")
        selected = _is(row, stage="main", gradient=BPTT, K=6, status="ok")
        if not selected or inv_t in (None, 1.0) or int(row["replicate"]) not in floor:
            continue
        key = (str(row["context"]), float(inv_t))
        low, n = out.get(key, (0, 0))
        below = float(row["test_miou"]) < floor[int(row["replicate"])]
        out[key] = (low + below, n + 1)
    return dict(sorted(out.items()))


def collapse_list(collapses: Mapping[tuple[str, float], tuple[int, int]]) -> str:
    """ "CD inv_t 10: 1 of 5; ..." for each (ham, inv_t) with a collapsed BPTT run ("" none)."""
    return "; ".join(f"{ham.upper()} inv_t {t:g}: {low} of {n}"
                     for (ham, t), (low, n) in collapses.items() if low)  # fmt: skip


def v3_lines(v3: Mapping[str, Sequence[float]]) -> tuple[str, ...]:
    out = []
    for ham in HAMS:
        interval = interval_of(v3[ham])
        if interval is not None:
            effect = PAPER_EFFECT[ham]
            excluded = "excludes" if interval.upper < effect else "does not exclude"
            out.append(f"{ham.upper()}: {fmt_interval(interval)}, {verdict(interval, MARGIN)} "
                       f"before any correction; the interval {excluded} the paper's "
                       f"+{effect:.3f}")  # fmt: skip
    return tuple(out)


def one_step_line(
    plan: Plan, primary: Sequence[Primary], over_gap: Mapping[str, Interval | None]
) -> str:
    """The first claim's line once every primary comparison is complete; it names the hams
    neither of whose arms lies above GAP (there the decomposition adds nothing measurable
    beyond a global summary to compare the gradients on)."""
    parts = []
    for v in primary:
        assert v.interval is not None
        lower = v.verdict == NON_INFERIOR and side_of_zero(v.interval) == "below"
        below = " but below BPTT" if lower else ""
        parts.append(f"{v.ham.upper()} {v.verdict}{below}, {fmt_interval(v.interval)}")
    excluded = [v.ham.upper() for v in primary if v.excludes_effect]
    kept = [v.ham.upper() for v in primary if not v.excludes_effect]
    effects = ", ".join(f"{v.ham.upper()} +{v.effect:.3f}" for v in primary)
    effect = (f"the paper's advantage of one-step ({effects}) is excluded for "
              + (", ".join(excluded) or "none") + (f", not for {', '.join(kept)}" if kept else ""))
    flat = [v.ham.upper() for v in primary if not any(
        i is not None and i.n >= 2 and side_of_zero(i) == "above"
        for label, i in over_gap.items() if label.startswith(f"{v.ham.upper()},"))]  # fmt: skip
    caveat = (f"; neither arm of {', '.join(flat)} lies above global average pooling, so there "
              "the gradients are compared where the decomposition adds nothing measurable "
              "beyond a global summary" if flat else "")  # fmt: skip
    return (f"One-step as good as BPTT at the paper's settings (δ = {MARGIN}, Holm over 3, "
            f"n = {plan.replicates}, one-step − BPTT test mIoU): {'; '.join(parts)}; "
            f"{effect}{caveat}.")  # fmt: skip


def gap_line(over_gap: Mapping[str, Interval | None]) -> str:
    """The second claim's line: the ham arms above, below and not distinguishable from GAP."""
    sides: dict[str, list[str]] = {"above": [], "below": [], "neither": []}
    for label, interval in over_gap.items():
        if interval is not None and interval.n >= 2:
            sides[side_of_zero(interval)].append(f"{label} {fmt_interval(interval)}")
    words = {"above": "above GAP", "below": "below GAP", "neither": "not distinguishable from GAP"}
    said = [f"{words[k]}: {'; '.join(v)}" for k, v in sides.items() if v]
    return ("The decomposition beyond a global summary (ham − global average pooling, test mIoU, "
            "uncorrected 95 % intervals): " + "; ".join(said) + ".")  # fmt: skip


def conclusions(
    plan: Plan, done: int, primary: Sequence[Primary], over_gap: Mapping[str, Interval | None],
    v3: Mapping[str, Sequence[float]],
    v3_collapsed: Mapping[tuple[str, float], tuple[int, int]],
) -> tuple[str, ...]:  # fmt: skip
    """One line per paper claim: the primary verdicts once complete, else study v3's interim
    intervals with their caveats; ham − GAP; where the other claims are measured."""
    complete = all(v.complete for v in primary)
    if complete:
        claim1 = one_step_line(plan, primary, over_gap)
    else:
        earlier = "; ".join(
            f"{ham.upper()} {fmt_interval(i)} {verdict(i, MARGIN)}"
            + (f", the paper's +{PAPER_EFFECT[ham]:.3f} excluded"
               if i.n >= 2 and i.upper < PAPER_EFFECT[ham] else "")
            for ham in HAMS if (i := interval_of(v3.get(ham, []))) is not None
        )  # fmt: skip
        failed = collapse_list(v3_collapsed)
        claim1 = (f"One-step as good as BPTT at the paper's settings: pending ({done} of "
                  f"{plan.replicates} replicates done)"
                  + (f"; study v3 there (interim, uncorrected): {earlier}"
                     if earlier else "")
                  + (f"; study v3's verdicts at sharper softmaxes compare against BPTT runs "
                     f"that scored below the no-context arm ({failed}), not the gradients' "
                     "quality" if failed else "")
                  + ".")  # fmt: skip
    if complete and any(i is not None for i in over_gap.values()):
        claim2 = gap_line(over_gap)
    else:
        claim2 = (f"The decomposition matters beyond global average pooling: pending ({done} of "
                  f"{plan.replicates} replicates done).")  # fmt: skip
    claim3 = ("BPTT's gradient ill-conditioned as K grows, and the ham as global context "
              "cheaper than attention: not tested at the paper's settings by this study; "
              "measured only on the legend_seg stress test (results page, sections 3 and 4).")
    return (claim1, claim2, claim3)
