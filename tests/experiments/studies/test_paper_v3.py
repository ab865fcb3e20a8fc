"""The paper-regime study v3: resume from the CSV, the report rebuilt from a synthetic CSV
(its numbers against an independent recomputation), and one tiny end-to-end run."""

from __future__ import annotations

import dataclasses
import math
import re
import statistics
from pathlib import Path
from typing import Any

import pytest
from scipy import stats

from experiments.studies.csv_rows import append_session, encode_curve, read_rows, write_rows
from experiments.studies.paper_v3 import run as paper_v3
from experiments.studies.paper_v3.length import (
    comparison_at_length,
    flatness,
    length_check,
    side,
    tail_jitter,
)
from experiments.studies.paper_v3.page import BEGIN, END, write_from_csv
from experiments.studies.paper_v3.plan import (
    BPTT,
    ONE_STEP,
    THROUGH_BASES,
    Job,
    Plan,
    all_jobs,
    arm_lrs,
    edge_selected,
    k_axis_jobs,
    length_jobs,
    main_jobs,
    pretrain_jobs,
    select_lr,
    tune_jobs,
)

PLAN = Plan(
    replicates=3, tune_replicates=(0, 1), k_replicates=(0, 1), lrs=(0.05, 0.1),
    inv_ts=(1.0, 10.0), ks=(1, 6), main_epochs=2, short_epochs=1, length_replicates=(0, 1),
)  # fmt: skip
ARM_OFFSET = {ONE_STEP: -0.004, THROUGH_BASES: 0.002, BPTT: 0.0, "-": -0.2}
REP_NOISE = {0: 0.003, 1: -0.002, 2: 0.001}


def _row(job: Job, **values: Any) -> dict[str, Any]:
    return {
        "job": job.key, "study": "paper_v3", "stage": job.stage, "regime": "finetune",
        "context": job.context, "gradient": job.gradient, "K": job.K, "inv_t": job.inv_t,
        "lr": job.lr, "replicate": job.replicate, "data_seed": PLAN.data_seed(job.replicate),
        "model_seed": job.replicate, "epochs": job.epochs, "status": "ok",
        "plan": PLAN.digest(), "started": 100.0, "finished": 110.0, "peak_mem_mb": 400.0,
        **values,
    }  # fmt: skip


def tune_score(job: Job) -> float:
    """BPTT prefers lr 0.1, everything else 0.05."""
    best = 0.1 if job.gradient == BPTT else 0.05
    return 0.6 - (0.05 if job.lr != best else 0.0) + 0.001 * job.replicate


def arm_score(job: Job) -> float:
    noise = REP_NOISE[job.replicate] * {ONE_STEP: 1.0, THROUGH_BASES: 0.5}.get(job.gradient, -1.0)
    return 0.7 + 0.02 * job.replicate + ARM_OFFSET[job.gradient] + noise + 0.001 * job.K


# the length check's change of final val mIoU per (gradient, replicate): BPTT's longer runs
# gain 0.02 on replicate 0 and 0.01 on replicate 1 (mean 0.015 >= δ: not long enough)
LENGTH_DELTA = {BPTT: {0: 0.02, 1: 0.01}}


def length_delta(job: Job) -> float:
    return LENGTH_DELTA.get(job.gradient, {}).get(job.replicate, 0.003 - 0.002 * job.replicate)


def synthetic_rows() -> dict[str, dict[str, Any]]:
    rows: dict[str, dict[str, Any]] = {}
    for job in pretrain_jobs(PLAN):
        rows[job.key] = _row(job, val_pixel_acc=0.9, train_s=5.0, steps=400)
    while todo := [j for j in tune_jobs(PLAN, rows) if j.key not in rows]:  # grids extend
        for job in todo:
            rows[job.key] = _row(job, val_miou=tune_score(job), test_miou=arm_score(job),
                                 val_curve="32:0.5;64:0.6", train_s=3.0)  # fmt: skip
    for job in [*main_jobs(PLAN, rows), *k_axis_jobs(PLAN, rows)]:
        if job.key not in rows:
            fidelity = "32:0.4;64:0.5" if job.gradient in (ONE_STEP, THROUGH_BASES) else ""
            rows[job.key] = _row(job, val_miou=arm_score(job) - 0.01, test_miou=arm_score(job),
                                 val_curve="32:0.5;48:0.695;64:0.7", fidelity=fidelity)  # fmt: skip
    for job in length_jobs(PLAN, rows):
        val = arm_score(job) - 0.01 + length_delta(job)
        test = arm_score(job) + length_delta(job)
        rows[job.key] = _row(job, val_miou=val, test_miou=test, val_curve="64:0.7")
    return rows


def test_selection_follows_the_val_scores() -> None:
    rows = synthetic_rows()
    for job in main_jobs(PLAN, rows):
        assert job.lr == (0.1 if job.gradient == BPTT else 0.05), job.key
    assert len({j.key for j in all_jobs(PLAN, rows)}) == len(rows)


def test_grids_extend_past_a_best_end_and_stop_at_the_cap() -> None:
    rows = synthetic_rows()
    # the base grid is (0.05, 0.1): BPTT's best (0.1) was the top, the others' (0.05) the bottom
    assert arm_lrs(PLAN, rows, "nmf", BPTT, None) == (0.05, 0.1, 0.2)
    assert arm_lrs(PLAN, rows, "nmf", ONE_STEP, None) == (0.025, 0.05, 0.1)
    assert arm_lrs(PLAN, rows, "nmf", THROUGH_BASES, None) == (0.025, 0.05, 0.1)
    assert not edge_selected(PLAN, rows, "nmf", BPTT, None)

    plan = dataclasses.replace(PLAN, lr_extensions=1)
    climbing: dict[str, dict[str, Any]] = {}  # val mIoU grows with the rate: extend once, stop
    while todo := [j for j in tune_jobs(plan, climbing) if j.key not in climbing]:
        for job in todo:
            climbing[job.key] = _row(job, val_miou=0.5 + job.lr)
    assert arm_lrs(plan, climbing, "none", "-", None) == (0.05, 0.1, 0.2)
    assert select_lr(plan, climbing, "none", "-", None) == 0.2
    assert edge_selected(plan, climbing, "none", "-", None)

    failed = {k: {**r, "status": "failed"} for k, r in climbing.items()}
    assert arm_lrs(plan, failed, "none", "-", None) == (0.05, 0.1)  # no score: no extension
    # the digest ignores the grid's shape, so rows stay valid when it grows
    assert plan.digest() == PLAN.digest() != dataclasses.replace(PLAN, pretrain_steps=1).digest()


def test_resume_skips_ok_rows_and_rebuilds_only_the_needed_backbone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    csv = tmp_path / "docs" / "v3.csv"
    rows = synthetic_rows()
    write_rows(csv, rows)
    calls: list[str] = []

    def fake_run_job(job: Job, plan: Plan, out_dir: Path) -> dict[str, Any]:
        calls.append(job.key)
        return {**rows[job.key], "status": "ok"}

    monkeypatch.setattr(paper_v3, "run_job", fake_run_job)
    out = tmp_path / "fresh_machine"  # no multirun folder: the CSV alone says what is done
    assert paper_v3.run_study(PLAN, out, csv, workers=1)["ran"] == 0
    assert calls == [] and not out.exists()

    failed = next(j for j in main_jobs(PLAN, rows) if j.replicate == 2)
    rows_now = read_rows(csv)
    rows_now[failed.key]["status"] = "failed"
    write_rows(csv, rows_now)
    counts = paper_v3.run_study(PLAN, out, csv, workers=1)
    assert calls == ["pretrain-r2", failed.key]  # the backbone of replicate 2 only, then the job
    assert counts == {"ran": 2, "failed": 0, "skipped": len(rows) - 1}
    assert read_rows(csv)[failed.key]["status"] == "ok"


def test_a_study_from_scratch_runs_pretraining_first_then_the_longest_jobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Job order of a run from an empty CSV (one worker): every pretraining, the tuning grid,
    then, once tuning has settled, the length check (2 x main epochs), the main arms, the K
    axis (short epochs): the longest jobs first, so none is left running alone at the end."""
    rows = synthetic_rows()
    order: list[Job] = []

    def fake_run_job(job: Job, plan: Plan, out_dir: Path) -> dict[str, Any]:
        order.append(job)
        return {**rows[job.key], "status": "ok"}

    monkeypatch.setattr(paper_v3, "run_job", fake_run_job)
    counts = paper_v3.run_study(PLAN, tmp_path / "out", tmp_path / "v3.csv", workers=1)
    assert counts["ran"] == len(rows) == len(order)
    stages = [job.stage for job in order]
    first_tune, last_tune = stages.index("tune"), len(stages) - stages[::-1].index("tune") - 1
    assert set(stages[:first_tune]) == {"pretrain"} and len(stages[:first_tune]) == PLAN.replicates
    assert set(stages[first_tune : last_tune + 1]) == {"tune"}
    after = [job.epochs for job in order[last_tune + 1 :]]
    assert after == sorted(after, reverse=True)
    assert after[0] == PLAN.length_factor * PLAN.main_epochs and after[-1] == PLAN.short_epochs


def _cells(page: str, first: str) -> list[list[str]]:
    return [
        [c.strip() for c in line.strip("|").split("|")]
        for line in page.splitlines()
        if line.startswith(f"| {first} |")
    ]


def test_report_from_csv_equals_a_recomputation(tmp_path: Path) -> None:
    csv = tmp_path / "results" / "v3.csv"
    rows = synthetic_rows()
    write_rows(csv, rows)
    append_session(csv, {"started": 0.0, "finished": 1800.0, "jobs_run": len(rows), "workers": 2,
                         "plan": PLAN.digest()})  # fmt: skip
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "results.md").write_text(
        f"# Title\n\nkept above\n\n{BEGIN}\nold\n{END}\n\nkept below\n"
    )
    page = write_from_csv(csv, docs, plan=PLAN).read_text()
    assert "kept above" in page and "kept below" in page and "\nold\n" not in page
    assert "Measured wall time of the runner: 30.0 min" in page
    assert "| 1 | – | " + str(len(rows)) + " | 2 | 30.0 |" in page  # the invocation's row
    # one invocation ran every job: the page states it as the measured run from scratch ...
    scratch = "part of `make study` took 30.0 min on 2 cores, against a budget of 150 min"
    assert scratch in page
    # ... which a CSV written by two invocations is not
    two = tmp_path / "two" / "v3.csv"
    write_rows(two, rows)
    for started in (0.0, 2000.0):
        append_session(two, {"started": started, "finished": started + 60, "workers": 2,
                             "jobs_run": len(rows), "plan": PLAN.digest()})  # fmt: skip
    (tmp_path / "two" / "docs").mkdir()
    assert scratch not in write_from_csv(two, tmp_path / "two" / "docs", plan=PLAN).read_text()
    # the plan's job time per stage: every synthetic row took 10 s
    n_main = len(main_jobs(PLAN, rows))
    assert f"| main | {n_main} | {n_main * 10 / 60:.1f} |" in page

    # every verdict row against the synthetic scores, recomputed here with scipy
    main = main_jobs(PLAN, rows)
    family = []
    for ham in ("NMF", "VQ", "CD"):
        for row in _cells(page, ham):
            if len(row) != 8 or "[" not in row[3]:  # the verdict table's rows
                continue
            arm = ONE_STEP if row[2].startswith("one-step (paper") else THROUGH_BASES
            inv_t = None if row[1] == "–" else float(row[1].split()[0])

            def score(g: str, r: int, ham: str = ham, inv_t: float | None = inv_t) -> float:
                (job,) = [j for j in main if (j.context, j.gradient, j.inv_t, j.replicate)
                          == (ham.lower(), g, inv_t, r)]  # fmt: skip
                return arm_score(job)

            diffs = [score(arm, r) - score(BPTT, r) for r in range(PLAN.replicates)]
            mean = statistics.fmean(diffs)
            low, high = stats.t.interval(0.95, len(diffs) - 1, mean, stats.sem(diffs))
            assert row[3] == f"{mean:+.3f} [{low:+.3f}, {high:+.3f}] (n=3)"
            expected = (
                "non-inferior" if low > -0.01 else "inferior" if high < -0.01 else "undecided"
            )
            assert row[4] == expected
            family.append(stats.ttest_1samp(diffs, -0.01).pvalue)
    assert len(family) == 2 * (1 + 2 + 2)  # NMF, VQ x 2 inv_t, CD x 2 inv_t; two arms each
    assert f"family of all {len(family)} verdicts" in page

    # the main table's test mIoU of one arm
    (vq_bptt,) = [r for r in _cells(page, "VQ, BPTT, inv_t 10") if len(r) == 6 and "±" in r[2]]
    values = [arm_score(j) for j in main if (j.context, j.gradient, j.inv_t) == ("vq", BPTT, 10.0)]
    assert vq_bptt[1] == "0.1"
    assert vq_bptt[2] == f"{statistics.fmean(values):.3f} ± {statistics.stdev(values):.3f}"
    # the val curves' tail: gain 0.7 - 0.695 = 0.005 < δ over the last 25 % of 64 steps
    assert re.search(r"(\d+) of \1 mean curves gained less than δ", page)
    # the length check: every arm but BPTT's (mean change 0.015) within δ; a row recomputed
    arms = [r for r in _cells(page, "VQ, BPTT, inv_t 10") if len(r) == 7]
    (row,) = arms
    short = [arm_score(j) - 0.01 for j in main if (j.context, j.gradient, j.inv_t, j.replicate)
             in {("vq", BPTT, 10.0, 0), ("vq", BPTT, 10.0, 1)}]  # fmt: skip
    long = [value + delta for value, delta in zip(short, (0.02, 0.01), strict=True)]
    assert row[1:] == ["2", f"{statistics.fmean(short):.3f}", f"{statistics.fmean(long):.3f}",
                       "+0.015",
                       "r0: +0.020, r1: +0.010", "no"]  # fmt: skip
    # each verdict's comparison at both lengths, recomputed from the synthetic scores: the
    # paper's one-step of VQ at inv_t 10 is within δ of BPTT after the main training and worse
    # after the longer one (BPTT's longer runs gain more)
    longer = length_jobs(PLAN, rows)

    def mean_difference(jobs: list[Job], extra: bool) -> float:
        def at(g: str, r: int) -> float:
            (job,) = [j for j in jobs if (j.context, j.gradient, j.inv_t, j.replicate)
                      == ("vq", g, 10.0, r)]  # fmt: skip
            return arm_score(job) + (length_delta(job) if extra else 0.0)

        return statistics.fmean(at(ONE_STEP, r) - at(BPTT, r) for r in PLAN.length_replicates)

    short_d, long_d = mean_difference(main, False), mean_difference(longer, True)
    assert side(short_d, 0.01) == "within δ" and side(long_d, 0.01) == "worse"
    (compared,) = [r for r in _cells(page, "VQ") if len(r) == 7 and r[1] == "10"
                   and r[2].startswith("one-step (paper")]  # fmt: skip
    assert compared[3:] == ["2", f"{short_d:+.3f} (within δ)", f"{long_d:+.3f} (worse)", "no"]
    # every synthetic one-step arm loses 0.017 (paper) / 0.013 (through the bases) against
    # BPTT in the longer runs: no comparison keeps its side
    assert "0 of 10 comparisons stay on the same side" in " ".join(page.split())
    n_arms = len({(j.context, j.gradient, j.inv_t) for j in main})
    n_bptt = 1 + 2 + 2  # NMF, VQ and CD at two inv_t each
    assert f"{n_arms - n_bptt} of {n_arms} main arms have" in " ".join(page.split())
    findings = (docs / "results" / "findings.md").read_text()
    assert BEGIN in findings and "VQ at inv_t 10" in findings
    # regenerating gives the same page
    assert write_from_csv(csv, docs, plan=PLAN).read_text() == page


@pytest.mark.slow
def test_tiny_study_runs_end_to_end_and_resumes(tmp_path: Path) -> None:
    plan = Plan(
        replicates=1, tune_replicates=(0,), k_replicates=(0,), length_replicates=(0,),
        lrs=(0.1,), inv_ts=(10.0,),
        ks=(1, 6), main_epochs=2, short_epochs=1, pretrain_steps=2, pretrain_images=8,
        overrides=("data.train_size=4", "data.val_size=2", "data.test_size=2", "batch_size=2"),
    )  # fmt: skip
    csv = tmp_path / "v3.csv"
    counts = paper_v3.run_study(plan, tmp_path / "out", csv, workers=1)
    rows = read_rows(csv)
    assert counts["failed"] == 0 and counts["ran"] == len(rows) == len(all_jobs(plan, rows))
    assert all(r["status"] == "ok" for r in rows.values())
    one_step = [r for r in rows.values() if r["gradient"] == ONE_STEP and r["stage"] == "main"]
    assert one_step and all(r["fidelity"] for r in one_step)
    assert all(math.isfinite(r["test_miou"]) for r in rows.values() if r["stage"] != "pretrain")
    assert paper_v3.run_study(plan, tmp_path / "out", csv, workers=1)["ran"] == 0


def test_flatness_reads_the_mean_curve_and_reports_every_run() -> None:
    # two runs gaining 0.04 and -0.01 over the last quarter (steps 75 -> 100): the mean curve
    # goes 0.71 -> 0.725 there, a gain of 0.015 >= δ
    run_a = [(25, 0.40), (50, 0.60), (75, 0.70), (100, 0.74)]
    run_b = [(25, 0.50), (50, 0.62), (75, 0.72), (100, 0.71)]
    rows = [{"val_curve": encode_curve(c)} for c in (run_a, run_b)]
    check = flatness(rows, 0.01)
    assert check is not None
    assert check.run_gains == pytest.approx((0.04, -0.01))
    assert check.mean_gain == pytest.approx(0.015)
    assert [s for s, _ in check.curve] == [25, 50, 75, 100]
    assert [v for _, v in check.curve] == pytest.approx([0.45, 0.61, 0.71, 0.725])
    assert sorted(check.jitter) == pytest.approx([0.01, 0.04])  # each run's step 75 -> 100
    assert not check.flat
    flat = flatness([{"val_curve": encode_curve([(50, 0.5), (100, 0.505)])}], 0.01)
    assert flat is not None and flat.flat and flat.row("arm")[4] == "1 of 1"
    # a curve too short to have a value at 75 % of the run gives no check
    assert flatness([{"val_curve": encode_curve([(100, 0.5)])}], 0.01) is None
    assert tail_jitter(run_a) == pytest.approx([0.04])


def test_length_check_pairs_replicates_and_uses_the_mean_change() -> None:
    # replicate 2 has no longer run, replicate 3 no main run: two pairs
    short = {0: 0.70, 1: 0.80, 2: 0.75}
    long = {0: 0.72, 1: 0.79, 3: 0.60}
    check = length_check(short, long, margin=0.01)
    assert check is not None
    assert check.pairs == ((0, 0.70, 0.72), (1, 0.80, 0.79))
    assert check.deltas == pytest.approx((0.02, -0.01))
    assert check.mean_delta == pytest.approx(0.005) and check.converged
    assert check.row("arm") == ("arm", "2", "0.750", "0.755", "+0.005", "r0: +0.020, r1: -0.010",
                                "yes")  # fmt: skip
    # a mean change of -0.02 (the longer runs end lower) is not within δ either
    assert not length_check({0: 0.7}, {0: 0.68}, margin=0.01).converged  # type: ignore[union-attr]
    assert length_check({0: 0.7}, {1: 0.7}, margin=0.01) is None


def test_a_comparison_at_length_pairs_replicates_with_all_four_scores() -> None:
    # replicate 1 lacks the reference's longer run: one pair
    check = comparison_at_length({0: 0.70, 1: 0.72}, {0: 0.705, 1: 0.70}, {0: 0.70, 1: 0.73},
                                 {0: 0.73}, margin=0.01)  # fmt: skip
    assert check is not None and [r for r, _, _ in check.pairs] == [0]
    assert (check.main, check.longer) == pytest.approx((-0.005, -0.03))
    assert check.row("NMF") == ("NMF", "1", "-0.005 (within δ)", "-0.030 (worse)", "no")
    assert not check.same_side
    assert [side(d, 0.01) for d in (-0.02, -0.01, 0.0, 0.01, 0.02)] == [
        "worse", "within δ", "within δ", "within δ", "better"]  # fmt: skip
    assert comparison_at_length({0: 0.7}, {0: 0.7}, {1: 0.7}, {1: 0.7}, margin=0.01) is None


def test_length_jobs_rerun_the_main_arms_longer_on_the_length_replicates() -> None:
    rows = synthetic_rows()
    main = main_jobs(PLAN, rows)
    longer = length_jobs(PLAN, rows)
    assert {j.replicate for j in longer} == set(PLAN.length_replicates)
    assert all(j.stage == "length" and j.epochs == 2 * PLAN.main_epochs for j in longer)
    same = {dataclasses.replace(j, stage="main", epochs=PLAN.main_epochs) for j in longer}
    assert same == {j for j in main if j.replicate in PLAN.length_replicates}
    assert {j.key for j in longer} <= {j.key for j in all_jobs(PLAN, rows)}
    with pytest.raises(ValueError, match="length_replicates"):
        Plan(replicates=2, length_replicates=(2,))
    with pytest.raises(ValueError, match="length_factor"):
        Plan(length_factor=1)


def test_a_verdict_against_a_collapsed_bptt_arm_carries_the_caveat() -> None:
    from experiments.studies.paper_v3.report import _verdicts

    rows = synthetic_rows()
    main = main_jobs(PLAN, rows)
    # VQ BPTT at inv_t 10 below the no-context arm on replicates 0 and 1 (of 3)
    for job in main:
        if (job.context, job.gradient, job.inv_t) == ("vq", BPTT, 10.0) and job.replicate < 2:
            rows[job.key] = {**rows[job.key], "test_miou": 0.1}
    verdicts = {(v.ham, v.inv_t, v.arm): v for v in _verdicts(PLAN, rows, main)}
    hit = verdicts[("vq", 10.0, ONE_STEP)]
    assert hit.reference_collapsed == (2, 3)
    assert "BPTT scored below the no-context arm in 2 of 3 replicates" in hit.sentence()
    assert verdicts[("vq", 1.0, ONE_STEP)].reference_collapsed == (0, 3)
    assert "caveat" not in verdicts[("vq", 1.0, ONE_STEP)].sentence()
