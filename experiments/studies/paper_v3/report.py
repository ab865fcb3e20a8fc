"""The paper-regime section of ``docs/results.md`` (study v3), computed from its CSV alone.

``paper_v3(rows, plan)`` turns the rows of ``docs/results/paper_v3.csv`` (written by
``experiments.studies.paper_v3``) into a ``PaperV3``: the setting and the "what differs from the
paper" table (from the composed job configs), the tuning grid with the selected learning rates,
the main arms on the test split, the training-length check (``paper_v3_length``) and the val
curves' tail gains, the verdicts (paired
95 % t-intervals over replicates, margin ``MARGIN``, Holm over the family), the collapse flags,
the K axis, the gradient fidelity along training and the measured time (``paper_v3_budget``).
Selection is recomputed with the runner's own functions (``experiments.studies.paper_v3.plan``),
so the page and the run agree on which job is which. ``page.md.j2`` writes it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from experiments.data.digit_canvas import CANVAS
from experiments.models.backbone import LocalBackbone
from experiments.reports.render import Table
from experiments.reports.verdicts import (
    Interval,
    holm,
    holm_verdict,
    p_value,
    paired_interval,
    verdict,
)
from experiments.studies.csv_rows import decode_curve
from experiments.studies.paper_v3.budget import ok_row, plan_budget
from experiments.studies.paper_v3.length import (
    ComparisonAtLength,
    Curve,
    comparison_at_length,
    flatness,
    length_check,
)
from experiments.studies.paper_v3.plan import (
    BASELINES,
    BPTT,
    HAMS,
    INV_T_NAMES,
    NO_GRADIENT,
    ONE_STEP,
    THROUGH_BASES,
    TUNED_GRADIENTS,
    Job,
    Plan,
    arm_lrs,
    edge_selected,
    jobs_of_stage,
    select_inv_t,
    select_lr,
    settled,
    tune_jobs,
)

MARGIN = 0.01  # δ in mIoU: the paper's own gaps are about one point
BUDGET_MIN = 150  # issue 27: the whole `make study` on 2 idle cores
BACKBONE_STRIDE = 4
GRADIENT_NAMES = {
    ONE_STEP: "one-step (paper: bases detached)",
    THROUGH_BASES: "one-step through the last step's bases",
    BPTT: "BPTT",
    NO_GRADIENT: "–",
}
CONTEXT_NAMES = {"none": "no context", "sdpa": "SDPA (parameter-matched)"}
# The official HamNet / VOC settings (docs: /shared/hamburger.md, sections 2 and 6).
OFFICIAL = {
    "backbone": "ResNet-101, ImageNet-pretrained",
    "receptive field": "ResNet-101's at output stride 8 (wider than the crop)",
    "channels d": "512",
    "rank r": "64",
    "n (pixels per ham)": "H·W of the stride-8 map",
    "steps trained": "60k SGD iterations",
    "optimiser and schedule": "SGD, poly LR",
    "block version": "HamburgerV1 / V2 (both in the official code)",
    "inv_t (VQ, CD)": "1 (INV_T = 1 set globally)",
    "K (train / eval)": "6 / 6 (shipped VOC setting)",
    "batch": "16",
    "data": "PASCAL VOC 2012",
}


def name_inv_t(inv_t: float | None) -> str:
    """``10`` -> "10"; ``1`` -> "1 (official HamNet setting (INV_T = 1))"; None -> "–"."""
    if inv_t is None:
        return "–"
    name = INV_T_NAMES.get(float(inv_t))
    return f"{inv_t:g}" + (f" ({name})" if name else "")


def arm_label(context: str, gradient: str, inv_t: float | None) -> str:
    """The document's name of an arm, e.g. "VQ, BPTT, inv_t 10"."""
    if context in CONTEXT_NAMES:
        return CONTEXT_NAMES[context]
    label = f"{context.upper()}, {GRADIENT_NAMES[gradient]}"
    return label if inv_t is None else f"{label}, inv_t {inv_t:g}"


def _mean_sd(values: Sequence[float]) -> str:
    if not values:
        return "–"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):.3f} ± {sd:.3f}"


def _fmt(value: float | None, sign: bool = False) -> str:
    if value is None or not math.isfinite(value):
        return "–"
    return f"{value:+.3f}" if sign else f"{value:.3f}"


def fmt_interval(interval: Interval) -> str:
    """ "+0.004 [−0.006, +0.014] (n=5)"."""
    bounds = f"[{_fmt(interval.lower, True)}, {_fmt(interval.upper, True)}]"
    return f"{_fmt(interval.mean, True)} {bounds} (n={interval.n})"


@dataclass(frozen=True)
class Verdict:
    """One comparison arm − BPTT (paired by replicate, test mIoU)."""

    ham: str
    inv_t: float | None
    arm: str  # ONE_STEP or THROUGH_BASES
    interval: Interval
    verdict: str
    p: float
    holm_p: float
    holm_verdict: str
    reference_collapsed: tuple[int, int] = (0, 0)  # BPTT runs below no context, of replicates

    def sentence(self) -> str:
        """ "VQ at inv_t 10: one-step (paper) − BPTT +0.004 [...] (n=5), non-inferior (Holm: …)",
        with a caveat when BPTT collapsed below the no-context arm."""
        where = self.ham.upper() + ("" if self.inv_t is None else f" at inv_t {self.inv_t:g}")
        low, of = self.reference_collapsed
        meaning = ("so this compares against a failed reference, not the gradients' quality"
                   if low == of else "and those replicates weigh on the difference")  # fmt: skip
        caveat = (f"; caveat: BPTT scored below the no-context arm in {low} of {of} "
                  f"replicates, {meaning}" if low else "")  # fmt: skip
        return (
            f"{where}: {GRADIENT_NAMES[self.arm]} − BPTT {fmt_interval(self.interval)}, "
            f"{self.verdict} (after Holm: {self.holm_verdict}){caveat}"
        )


@dataclass(frozen=True)
class PaperV3:
    """Everything the paper-regime section says (see the module docstring)."""

    csv: str
    margin: float
    plan: Plan
    jobs_ok: int
    jobs_total: int
    jobs_failed: tuple[str, ...]
    tuned: bool
    differs: Table
    tuning: Table
    main: Table
    flat: Table
    flat_count: int
    flat_total: int
    length: Table
    length_count: int  # arms whose longer runs end within δ of the main runs
    length_total: int  # arms with at least one (main, longer) pair
    length_verdicts: Table  # each verdict's comparison after the main and the longer training
    length_same: int  # comparisons on the same side of ±δ at both lengths
    length_compared: int  # comparisons with at least one replicate at both lengths
    verdicts: tuple[Verdict, ...]
    verdict_table: Table
    collapse: Table
    k_axis: Table
    k_inv_ts: str
    fidelity: Table
    fidelity_curve: tuple[tuple[str, tuple[tuple[int, float], ...]], ...]
    val_curves: tuple[ArmCurve, ...]
    val_jitter: float | None  # median |epoch-to-epoch change| of a run's val mIoU, last 25 %
    wall_minutes: float | None
    session_table: Table  # every invocation of the runner with this plan
    stage_table: Table  # the plan's own jobs: job minutes per stage
    sessions: int
    job_minutes: float
    peak_mem_mb: float | None
    pretrain: Table
    edge_arms: tuple[str, ...]
    extended_arms: tuple[str, ...]
    stale_rows: int
    plan_job_minutes: float
    from_scratch_minutes: float | None
    budget_minutes: int


def _ok_values(
    rows: Mapping[str, Mapping[str, Any]], jobs: Sequence[Job], column: str
) -> list[tuple[Job, float]]:
    """(job, value) for each job whose row is ok and holds a finite ``column``, in job order."""
    out = []
    for job in jobs:
        row = rows.get(job.key)
        if ok_row(row) and row is not None and row.get(column) is not None:
            value = float(row[column])
            if math.isfinite(value):
                out.append((job, value))
    return out


def _values(rows: Mapping[str, Mapping[str, Any]], jobs: Sequence[Job], column: str) -> list[float]:
    return [value for _, value in _ok_values(rows, jobs, column)]


def _main_arms(plan: Plan) -> list[tuple[str, str, float | None]]:
    arms: list[tuple[str, str, float | None]] = [(b, NO_GRADIENT, None) for b in BASELINES]
    for ham in HAMS:
        for inv_t in plan.inv_ts_of(ham):
            arms += [(ham, g, inv_t) for g in (ONE_STEP, THROUGH_BASES, BPTT)]
    return arms


def _arm_jobs(jobs: Sequence[Job], context: str, gradient: str, inv_t: float | None) -> list[Job]:
    return [j for j in jobs if (j.context, j.gradient, j.inv_t) == (context, gradient, inv_t)]


def _by_replicate(
    rows: Mapping[str, Mapping[str, Any]], jobs: Sequence[Job], column: str = "test_miou"
) -> dict[int, float]:
    return {job.replicate: value for job, value in _ok_values(rows, jobs, column)}


def _tuning_table(plan: Plan, rows: Mapping[str, Mapping[str, Any]], tuned: bool) -> Table:
    jobs = tune_jobs(plan, rows)
    arms = [(c, g, t) for c, g in _tuned_arms() for t in plan.inv_ts_of(c)]
    lrs = sorted({j.lr for j in jobs if j.lr is not None})
    out = []
    for context, gradient, inv_t in arms:
        cells: list[Any] = [context.upper() if context in HAMS else CONTEXT_NAMES[context],
                            GRADIENT_NAMES[gradient], name_inv_t(inv_t)]  # fmt: skip
        for lr in lrs:
            arm = [j for j in _arm_jobs(jobs, context, gradient, inv_t) if j.lr == lr]
            values = _values(rows, arm, "val_miou")
            cells.append(_fmt(statistics.fmean(values)) if values else "–")
        cells.append(f"{select_lr(plan, rows, context, gradient, inv_t):g}" if tuned else "–")
        out.append(cells)
    header = ["context", "gradient", "inv_t", *[f"val mIoU @ lr {lr:g}" for lr in lrs],
              "selected lr"]  # fmt: skip
    return Table.of(header, out)


def _tuned_arms() -> list[tuple[str, str]]:
    return [(b, NO_GRADIENT) for b in BASELINES] + [(h, g) for h in HAMS for g in TUNED_GRADIENTS]


def _extended_arms(plan: Plan, rows: Mapping[str, Mapping[str, Any]]) -> tuple[str, ...]:
    """The tuned arms whose grid was extended past an end of ``lrs``, with the rates added."""
    base = set(plan.lrs)
    out = []
    for c, g in _tuned_arms():
        for t in plan.inv_ts_of(c):
            added = [lr for lr in arm_lrs(plan, rows, c, g, t) if lr not in base]
            if added:
                out.append(f"{arm_label(c, g, t)}: {', '.join(f'{lr:g}' for lr in added)}")
    return tuple(out)


def _edge_arms(plan: Plan, rows: Mapping[str, Mapping[str, Any]]) -> tuple[str, ...]:
    """The tuned arms whose selected learning rate is still an end of their extended grid (the
    extensions ran out: a better one may lie beyond it)."""
    return tuple(
        arm_label(c, g, t)
        for c, g in _tuned_arms()
        for t in plan.inv_ts_of(c)
        if edge_selected(plan, rows, c, g, t)
    )


@dataclass(frozen=True)
class ArmCurve:
    """A main arm's mean val curve over its replicates [(step, val mIoU)]."""

    label: str
    context: str
    gradient: str
    inv_t: float | None
    curve: Curve


def _verdicts(
    plan: Plan, rows: Mapping[str, Mapping[str, Any]], main: Sequence[Job]
) -> list[Verdict]:
    raw: list[tuple[str, float | None, str, Interval, float]] = []
    none_scores = _by_replicate(rows, _arm_jobs(main, "none", NO_GRADIENT, None))
    collapsed: dict[tuple[str, float | None], tuple[int, int]] = {}
    for ham in HAMS:
        for inv_t in plan.inv_ts_of(ham):
            reference = _by_replicate(rows, _arm_jobs(main, ham, BPTT, inv_t))
            paired_none = [r for r in reference if r in none_scores]
            low = sum(reference[r] < none_scores[r] for r in paired_none)
            collapsed[(ham, inv_t)] = (low, len(paired_none))
            for arm in (ONE_STEP, THROUGH_BASES):
                values = _by_replicate(rows, _arm_jobs(main, ham, arm, inv_t))
                diffs = [values[r] - reference[r] for r in sorted(values) if r in reference]
                if diffs:
                    raw.append((ham, inv_t, arm, paired_interval(diffs), p_value(diffs, MARGIN)))
    adjusted = holm([p for *_, p in raw])
    return [
        Verdict(ham, inv_t, arm, interval, verdict(interval, MARGIN), p, q,
                holm_verdict(interval, q, MARGIN), collapsed[(ham, inv_t)])
        for (ham, inv_t, arm, interval, p), q in zip(raw, adjusted, strict=True)
    ]  # fmt: skip


def _differs(plan: Plan) -> Table:
    """Ours (from the composed config of a main job) vs the official settings."""
    from experiments.studies.paper_v3.run import compose_job

    job = Job("main", "vq", ONE_STEP, plan.main_k, plan.inv_ts[0], plan.lrs[0], 0, plan.main_epochs)
    cfg = compose_job(job, plan, Path("multirun/study_v3"))
    data, context, optim = cfg.data, cfg.context, cfg.optim
    per_epoch = math.ceil(data.train_size / cfg.batch_size)  # type: ignore[attr-defined]
    side = CANVAS // BACKBONE_STRIDE
    ours = {
        "backbone": f"LocalBackbone (4 convs, stride {BACKBONE_STRIDE}), pretrained on clean "
        f"digit canvases of the replicate's train scans ({plan.pretrain_steps} AdamW steps, "
        f"{plan.pretrain_images} canvases), fine-tuned at {cfg.model.backbone_lr_scale}x the lr",
        "receptive field": f"{LocalBackbone.receptive_field} x {LocalBackbone.receptive_field} "
        f"pixels of a {CANVAS} x {CANVAS} canvas",
        "channels d": str(cfg.model.width),
        "rank r": str(context.rank),  # type: ignore[attr-defined]
        "n (pixels per ham)": f"{side * side} ({side} x {side} map)",
        "steps trained": f"{plan.main_epochs * per_epoch} (main arms); "
        f"{plan.short_epochs * per_epoch} (tuning grid, K axis)",
        "optimiser and schedule": f"{optim._target_.rsplit('.', 1)[-1]} (momentum "
        f"{optim.momentum}, weight decay {optim.weight_decay}), lr tuned from "  # type: ignore[attr-defined]
        f"{{{', '.join(f'{lr:g}' for lr in plan.lrs)}}}, poly LR (power {cfg.lr_poly_power})",
        "block version": f"Hamburger {context.version}",  # type: ignore[attr-defined]
        "inv_t (VQ, CD)": f"{', '.join(f'{t:g}' for t in plan.inv_ts)} (an axis)",
        "K (train / eval)": f"{plan.main_k} / {plan.main_k} (K axis: "
        f"{', '.join(str(k) for k in plan.ks)})",
        "batch": str(cfg.batch_size),
        "data": f"digit_seg: {data.train_size} train / {data.val_size} val / "  # type: ignore[attr-defined]
        f"{data.test_size} test canvases on disjoint digit scans, per replicate",  # type: ignore[attr-defined]
    }
    return Table.of(["setting", "this study", "official (HamNet, VOC)"],
                    [(k, ours[k], OFFICIAL[k]) for k in OFFICIAL])  # fmt: skip


def _k_table(plan: Plan, rows: list[tuple[Any, ...]]) -> Table:
    return Table.of(["ham", "gradient", *[f"K={k}" for k in plan.ks]], rows)


def _k_axis(
    plan: Plan, rows: Mapping[str, Mapping[str, Any]], k_jobs: Sequence[Job]
) -> tuple[Table, list[str]]:
    """Test mIoU per ham, gradient and K (mean ± sd over the K axis's replicates) and the
    mean paired one-step − BPTT per K; the inv_t of each ham's axis."""
    out: list[tuple[Any, ...]] = []
    chosen = []
    for ham in HAMS:
        inv_t = select_inv_t(plan, rows, ham)
        if inv_t is not None:
            chosen.append(f"{ham.upper()} {inv_t:g}")
        per_k: dict[str, dict[int, dict[int, float]]] = {}
        for g in TUNED_GRADIENTS:
            per_k[g] = {}
            for k in plan.ks:
                jobs = [j for j in k_jobs if (j.context, j.gradient, j.K) == (ham, g, k)]
                per_k[g][k] = _by_replicate(rows, jobs)
            cells = [_mean_sd(list(per_k[g][k].values())) for k in plan.ks]
            out.append((ham.upper(), GRADIENT_NAMES[g], *cells))
        diffs = []
        for k in plan.ks:
            one, ref = per_k[ONE_STEP][k], per_k[BPTT][k]
            d = [one[r] - ref[r] for r in one if r in ref]
            diffs.append(_fmt(statistics.fmean(d), True) if d else "–")
        out.append((ham.upper(), "one-step − BPTT (mean)", *diffs))
    return _k_table(plan, out), chosen


def _fidelity(
    plan: Plan, rows: Mapping[str, Mapping[str, Any]], main: Sequence[Job]
) -> tuple[Table, list[tuple[str, Curve]]]:
    """Per one-step arm: the cosine to BPTT along training, averaged over replicates."""
    table_rows, curves = [], []
    for ham in HAMS:
        for inv_t in plan.inv_ts_of(ham):
            for g in (ONE_STEP, THROUGH_BASES):
                arm = [j for j in _arm_jobs(main, ham, g, inv_t) if ok_row(rows.get(j.key))]
                series = [c for j in arm if (c := decode_curve(rows[j.key].get("fidelity")))]
                if not series:
                    continue
                steps = sorted({s for curve in series for s, _ in curve})
                mean = tuple(
                    (s, statistics.fmean([v for curve in series for t, v in curve if t == s]))
                    for s in steps
                )
                label = arm_label(ham, g, inv_t)
                curves.append((label, mean))
                overall = [v for curve in series for _, v in curve]
                middle = mean[len(mean) // 2][1]
                table_rows.append((label, len(series), _fmt(mean[0][1]), _fmt(middle),
                                   _fmt(mean[-1][1]), _fmt(statistics.fmean(overall)),
                                   _fmt(min(overall))))  # fmt: skip
    header = ["arm", "runs", "first checkpoint", "middle", "last", "mean", "min"]
    return Table.of(header, table_rows), curves


def paper_v3(
    rows: Mapping[str, Mapping[str, Any]],
    plan: Plan,
    csv: str,
    sessions: Sequence[Mapping[str, Any]],
) -> PaperV3:
    """The section's data from the CSV rows (job key -> row) and the sessions sidecar."""
    tuned = settled(rows, tune_jobs(plan, rows))
    main = list(jobs_of_stage(plan, rows, "main")) if tuned else []
    k_jobs = list(jobs_of_stage(plan, rows, "k_axis")) if tuned else []
    longer = list(jobs_of_stage(plan, rows, "length")) if tuned else []
    known = [*jobs_of_stage(plan, rows, "pretrain"), *tune_jobs(plan, rows), *main, *k_jobs,
             *longer]  # fmt: skip
    expected = {j.key for j in known}
    ok = sum(ok_row(rows.get(k)) for k in expected)
    failed = tuple(sorted(k for k in expected if k in rows and not ok_row(rows[k])))

    none_scores = _by_replicate(rows, _arm_jobs(main, "none", NO_GRADIENT, None))
    main_rows, flat_rows, collapse_rows = [], [], []
    val_curves: list[ArmCurve] = []
    jitter: list[float] = []
    flat_count = flat_total = length_count = length_total = 0
    length_rows = []
    for context, gradient, inv_t in _main_arms(plan):
        arm = _arm_jobs(main, context, gradient, inv_t)
        test = _values(rows, arm, "test_miou")
        scores = _by_replicate(rows, arm)
        collapsed = sorted(r for r, v in scores.items() if r in none_scores and v < none_scores[r])
        lr = arm[0].lr if arm else None
        main_rows.append((arm_label(context, gradient, inv_t), "–" if lr is None else f"{lr:g}",
                          _mean_sd(test), _mean_sd(_values(rows, arm, "val_miou")), len(test),
                          ", ".join(map(str, collapsed)) or "none"))  # fmt: skip
        if context != "none":
            collapse_rows.append((arm_label(context, gradient, inv_t), len(collapsed), len(scores)))
        arm_rows = [rows[j.key] for j in arm if ok_row(rows.get(j.key))]
        check = flatness(arm_rows, MARGIN)
        if check is not None:
            jitter += check.jitter
            label = arm_label(context, gradient, inv_t)
            val_curves.append(ArmCurve(label, context, gradient, inv_t, check.curve))
            flat_count += check.flat
            flat_total += 1
            flat_rows.append(check.row(label))
        long_arm = _arm_jobs(longer, context, gradient, inv_t)
        length = length_check(_by_replicate(rows, arm, "val_miou"),
                              _by_replicate(rows, long_arm, "val_miou"), MARGIN)  # fmt: skip
        if length is not None:
            length_rows.append(length.row(arm_label(context, gradient, inv_t)))
            length_count += length.converged
            length_total += 1

    verdicts = _verdicts(plan, rows, main)
    length_verdicts = _verdicts_at_length(rows, main, longer, verdicts)
    verdict_table = Table.of(
        ["ham", "inv_t", "arm − BPTT", "test mIoU difference [95 % CI]", "verdict", "p", "Holm p",
         "after Holm"],
        [(v.ham.upper(), name_inv_t(v.inv_t), GRADIENT_NAMES[v.arm], fmt_interval(v.interval),
          v.verdict, f"{v.p:.3g}", f"{v.holm_p:.3g}", v.holm_verdict) for v in verdicts],
    )  # fmt: skip

    k_axis, k_inv = _k_axis(plan, rows, k_jobs) if tuned else (_k_table(plan, []), [])
    fidelity, curves = _fidelity(plan, rows, main)

    pre = [rows[j.key] for j in jobs_of_stage(plan, rows, "pretrain") if ok_row(rows.get(j.key))]
    pretrain = Table.of(["replicate", "data seed", "clean val pixel accuracy", "seconds"],
                        [(r["replicate"], r["data_seed"], _fmt(r["val_pixel_acc"]),
                          f"{r['train_s']:.0f}") for r in pre])  # fmt: skip
    budget = plan_budget(plan, rows, sessions, known, expected, ok)
    return PaperV3(
        csv=csv,
        margin=MARGIN,
        plan=plan,
        jobs_ok=ok,
        jobs_total=len(expected),
        jobs_failed=failed,
        tuned=tuned,
        differs=_differs(plan),
        tuning=_tuning_table(plan, rows, tuned),
        main=Table.of(
            ["arm", "lr", "test mIoU", "val mIoU", "n", "collapsed (replicates)"], main_rows
        ),
        flat=Table.of(
            [
                "arm",
                "mean curve: gain, last 25 %",
                "runs: smallest gain",
                "runs: largest gain",
                "runs with gain < δ",
                "flat",
            ],
            flat_rows,
        ),
        flat_count=flat_count,
        flat_total=flat_total,
        length=Table.of(_length_header(plan), length_rows),
        length_count=length_count,
        length_total=length_total,
        length_verdicts=Table.of(
            [
                "ham",
                "inv_t",
                "arm − BPTT",
                "replicates",
                f"test mIoU difference, {plan.main_epochs} epochs",
                f"test mIoU difference, {plan.length_factor * plan.main_epochs} epochs",
                "same side of ±δ",
            ],
            [c.row(*labels) for labels, c in length_verdicts],
        ),
        length_same=sum(c.same_side for _, c in length_verdicts),
        length_compared=len(length_verdicts),
        verdicts=tuple(verdicts),
        verdict_table=verdict_table,
        collapse=Table.of(["arm", "replicates below no context", "replicates"], collapse_rows),
        k_axis=k_axis,
        k_inv_ts=", ".join(k_inv),
        fidelity=fidelity,
        fidelity_curve=tuple(curves),
        val_curves=tuple(val_curves),
        val_jitter=statistics.median(jitter) if jitter else None,
        wall_minutes=budget.wall_minutes,
        sessions=budget.sessions,
        session_table=budget.session_table,
        stage_table=budget.stage_table,
        job_minutes=budget.job_minutes,
        peak_mem_mb=budget.peak_mem_mb,
        pretrain=pretrain,
        edge_arms=_edge_arms(plan, rows) if tuned else (),
        extended_arms=_extended_arms(plan, rows),
        stale_rows=sum(k not in expected for k in rows),
        plan_job_minutes=budget.plan_job_minutes,
        from_scratch_minutes=budget.from_scratch_minutes,
        budget_minutes=BUDGET_MIN,
    )


def _verdicts_at_length(
    rows: Mapping[str, Mapping[str, Any]],
    main: Sequence[Job],
    longer: Sequence[Job],
    verdicts: Sequence[Verdict],
) -> list[tuple[tuple[str, str, str], ComparisonAtLength]]:
    """Each verdict's comparison (arm − BPTT, test mIoU) on the replicates that also ran
    longer, after the main and after the longer training, with its row labels."""
    out = []
    for v in verdicts:
        arm, reference, arm_longer, reference_longer = (
            _by_replicate(rows, _arm_jobs(jobs, v.ham, gradient, v.inv_t))
            for jobs in (main, longer)
            for gradient in (v.arm, BPTT)
        )
        check = comparison_at_length(arm, reference, arm_longer, reference_longer, MARGIN)
        if check is not None:
            out.append(((v.ham.upper(), name_inv_t(v.inv_t), GRADIENT_NAMES[v.arm]), check))
    return out


def _length_header(plan: Plan) -> list[str]:
    longer = plan.length_factor * plan.main_epochs
    return ["arm", "pairs", f"final val mIoU, {plan.main_epochs} epochs",
            f"final val mIoU, {longer} epochs", "mean change", "change per replicate",
            "long enough"]  # fmt: skip
