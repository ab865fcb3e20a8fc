"""Study v4: the plan (primary arms, disjoint tuning replicates, one rate per ham), the verdict
and power arithmetic against independent computations (scipy's t-test, a brute-force Holm, a
Monte-Carlo power), the page with zero, partial and complete rows, and the rows' provenance
with a bit-for-bit re-run of a tiny job."""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy import stats

from experiments.reports.verdicts import Interval
from experiments.studies.csv_rows import read_row_list, read_rows, write_row_list, write_rows
from experiments.studies.paper_v4 import conclusions, drift, report, rerun, run
from experiments.studies.paper_v4.jobs import BPTT, NO_GRADIENT, ONE_STEP, Job
from experiments.studies.paper_v4.plan import (
    HAMS,
    MARGIN,
    PAPER_EFFECT,
    Plan,
    all_jobs,
    jobs_of_stage,
    main_jobs,
    pretrain_jobs,
    select_lr,
    start_order,
    tune_jobs,
    tuned,
)
from experiments.studies.paper_v4.power import power, replicates_for
from experiments.studies.paper_v4.primary import primary_comparisons

PLAN = Plan(replicates=6, tune_replicates=(50, 51), lrs=(0.025, 0.05, 0.1),
            length_replicates=(0, 1), secondary_replicates=(0,), ks=(1,))  # fmt: skip
# per ham: the true one-step - BPTT difference of the synthetic rows
TRUE = {"nmf": -0.05, "vq": 0.002, "cd": -0.012}


def _row(job: Job, plan: Plan = PLAN, **values: Any) -> dict[str, Any]:
    return {"job": job.key, "study": "paper_v4", "stage": job.stage, "context": job.context,
            "gradient": job.gradient, "K": job.K, "inv_t": job.inv_t, "lr": job.lr,
            "replicate": job.replicate, "epochs": job.epochs, "status": "ok",
            "plan": plan.digest(), "started": 0.0, "finished": 60.0 * max(job.epochs, 1) / 32,
            "cpu": "Test CPU", "threads": 1, "commit": "abc", **values}  # fmt: skip


def _tuning_rows(plan: Plan = PLAN) -> dict[str, dict[str, Any]]:
    # by rate (ascending): one-step peaks at the third, BPTT at the first, their mean at the
    # second: one rate for both, the second
    peak = {ONE_STEP: (0.70, 0.78, 0.80), BPTT: (0.80, 0.79, 0.60)}
    rows = {}
    for job in tune_jobs(plan):
        assert job.lr is not None
        score = peak.get(job.gradient, (0.5, 0.6, 0.55))[sorted(plan.lrs).index(job.lr)]
        rows[job.key] = _row(job, plan, val_miou=score)
    return rows


def _full_rows(
    replicates: int, seed: int = 0
) -> tuple[dict[str, dict[str, Any]], dict[str, list[float]]]:
    rng = random.Random(seed)
    rows = _tuning_rows()
    diffs: dict[str, list[float]] = {h: [] for h in HAMS}
    scores: dict[tuple[str, str, int], float] = {}
    for job in main_jobs(PLAN, rows):
        if job.replicate >= replicates:
            continue
        base = 0.6 if job.context == "none" else 0.7 if job.context == "gap" else 0.8
        noise = rng.gauss(0, 0.01)
        value = base + (TRUE[job.context] if job.gradient == ONE_STEP else 0.0) + noise
        if (job.context, job.gradient, job.replicate) == ("cd", BPTT, 2):
            value = 0.5  # a collapse: below the no-context arm
        scores[(job.context, job.gradient, job.replicate)] = value
        rows[job.key] = _row(job, test_miou=value, val_miou=value)
    for ham in HAMS:
        diffs[ham] = [
            scores[(ham, ONE_STEP, r)] - scores[(ham, BPTT, r)] for r in range(replicates)
        ]
    return rows, diffs


def test_the_plan_fixes_the_primary_arms_and_keeps_tuning_off_the_test_replicates() -> None:
    plan = Plan()
    assert plan.replicates >= 20 and plan.primary_inv_t == 1.0 and plan.main_k == 6
    assert set(plan.tune_replicates).isdisjoint(range(plan.replicates))
    rows = _tuning_rows(plan)
    main = main_jobs(plan, rows)
    assert {j.replicate for j in main} == set(range(plan.replicates))
    per_replicate = {(j.context, j.gradient, j.K, j.inv_t) for j in main if j.replicate == 0}
    assert per_replicate == {("none", NO_GRADIENT, 0, None), ("gap", NO_GRADIENT, 0, None),
                             ("nmf", ONE_STEP, 6, None), ("nmf", BPTT, 6, None),
                             ("vq", ONE_STEP, 6, 1.0), ("vq", BPTT, 6, 1.0),
                             ("cd", ONE_STEP, 6, 1.0), ("cd", BPTT, 6, 1.0)}  # fmt: skip
    assert {j.epochs for j in tune_jobs(plan)} == {plan.main_epochs}  # tuned at full length
    assert {j.replicate for j in tune_jobs(plan)} == set(plan.tune_replicates)
    # before tuning has settled only pretraining and tuning are known
    assert {j.stage for j in all_jobs(plan, {})} == {"pretrain", "tune"}
    assert [j.replicate for j in pretrain_jobs(plan)][:2] == list(plan.tune_replicates)
    with pytest.raises(ValueError, match="disjoint"):
        Plan(replicates=3, tune_replicates=(2,))
    with pytest.raises(ValueError, match="not test replicates"):
        Plan(replicates=3, tune_replicates=(9,), length_replicates=(5,))


def test_one_rate_per_ham_for_both_gradients_from_their_mean() -> None:
    rows = _tuning_rows()
    assert select_lr(PLAN, rows, "vq") == 0.05
    for ham in HAMS:
        rates = {j.lr for j in main_jobs(PLAN, rows) if j.context == ham}
        assert rates == {0.05}
    assert select_lr(PLAN, rows, "gap") == 0.05
    # a failed tuning job scores -inf: its rate is not selected
    failed = dict(rows)
    for job in tune_jobs(PLAN):
        if job.context == "vq" and job.lr == 0.05 and job.gradient == BPTT:
            failed[job.key] = {**failed[job.key], "status": "failed"}
    assert select_lr(PLAN, failed, "vq") != 0.05


def test_a_job_stopped_by_its_environment_does_not_settle_the_tuning() -> None:
    """A tuning job that failed because its folder held another config's checkpoints (seen in
    this study: a ResumeConflictError after a config field's recorded default changed) is not a
    rate's outcome: no rate is selected and no main job exists until its retry has a row."""
    rows = _tuning_rows()
    assert tuned(PLAN, rows) and main_jobs(PLAN, rows)
    rate = select_lr(PLAN, rows, "nmf")
    job = next(j for j in tune_jobs(PLAN)
               if j.context == "nmf" and j.gradient == ONE_STEP and j.lr == rate)  # fmt: skip
    conflict = {**rows[job.key], "status": "failed",
                "error": "ResumeConflictError: .../step-000000099.pt was written by a run with a "
                         "different config (solver.max_steps)"}  # fmt: skip
    assert not tuned(PLAN, {**rows, job.key: conflict})
    assert jobs_of_stage(PLAN, {**rows, job.key: conflict}, "main") == []
    diverged = {**conflict, "error": "NonFiniteError: loss is nan at step 12"}
    assert tuned(PLAN, {**rows, job.key: diverged})  # a training failure is an outcome
    assert select_lr(PLAN, {**rows, job.key: diverged}, "nmf") != job.lr


def test_the_runner_starts_tuning_first_and_whole_replicates_in_order() -> None:
    rows = _tuning_rows()
    jobs = sorted(all_jobs(PLAN, rows), key=lambda j: start_order(PLAN, j))
    stages = [j.stage for j in jobs]
    # the tuning replicates' backbones, the tuning, then each test replicate's backbone and arms
    assert [j.replicate for j in jobs[:2]] == [50, 51] and set(stages[:2]) == {"pretrain"}
    first_main = stages.index("main")
    assert set(stages[2 : first_main - 1]) == {"tune"} and jobs[first_main - 1].key == "pretrain-r0"
    rest = [(j.stage, j.replicate) for j in jobs[first_main - 1 :]]
    replicates = [r for stage, r in rest if stage in ("pretrain", "main")]
    assert replicates == sorted(replicates) and stages[-1] == "secondary"
    assert stages.index("length") > max(i for i, s in enumerate(stages) if s == "main")


def test_resume_skips_ok_rows_and_rebuilds_only_the_needed_backbone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From the committed CSV alone (a fresh machine, no study folder): every job ok runs
    nothing and creates no folder; a failed main job runs again after its own replicate's
    backbone is rebuilt, and no other."""
    rows = _tuning_rows()
    rows.update({j.key: _row(j, val_miou=0.7, test_miou=0.7)
                 for j in all_jobs(PLAN, rows) if j.key not in rows})  # fmt: skip
    csv = tmp_path / "docs" / "v4.csv"
    write_rows(csv, rows, run.COLUMNS)
    calls: list[str] = []

    def fake_run_job(job: Job, plan: Plan, out_dir: Path) -> dict[str, Any]:
        calls.append(job.key)
        return {**rows[job.key], "status": "ok"}

    monkeypatch.setattr(run, "run_job", fake_run_job)
    out = tmp_path / "fresh_machine"
    assert run.run_study(PLAN, out, csv, workers=1)["ran"] == 0
    assert calls == [] and not out.exists()

    failed = next(j for j in main_jobs(PLAN, rows) if j.replicate == 2)
    rows_now = read_rows(csv, run.COLUMNS)
    rows_now[failed.key]["status"] = "failed"
    write_rows(csv, rows_now, run.COLUMNS)
    counts = run.run_study(PLAN, out, csv, workers=1)
    assert calls == ["pretrain-r2", failed.key]  # the backbone of replicate 2 only, then the job
    assert counts == {"ran": 2, "failed": 0, "skipped": len(rows) - 1}
    assert read_rows(csv, run.COLUMNS)[failed.key]["status"] == "ok"


def _holm(p: list[float]) -> list[float]:
    """Holm by its definition: p_(i) adjusted = max over j <= i of (m - j) p_(j), capped at 1."""
    m = len(p)
    ranked = sorted(p)
    out = []
    for value in p:
        i = ranked.index(value)
        out.append(min(1.0, max((m - j) * ranked[j] for j in range(i + 1))))
    return out


def test_primary_verdicts_match_scipy_and_holm_with_the_paper_effect_and_collapses() -> None:
    rows, diffs = _full_rows(PLAN.replicates)
    doc = report.paper_v4(rows, PLAN, "x.csv", {})
    ps = [float(stats.ttest_1samp(diffs[h], -MARGIN).pvalue) for h in HAMS]
    for v, ham, q in zip(doc.primary, HAMS, _holm(ps), strict=True):
        d = np.array(diffs[ham])
        low, high = stats.t.interval(0.95, len(d) - 1, loc=d.mean(), scale=stats.sem(d))
        assert v.interval is not None and v.complete
        assert v.interval.mean == pytest.approx(d.mean(), abs=1e-12)
        assert (v.interval.lower, v.interval.upper) == pytest.approx((low, high), abs=1e-12)
        assert v.p == pytest.approx(ps[HAMS.index(ham)], rel=1e-9)
        assert v.holm_p == pytest.approx(q, rel=1e-9)
        decided = q < 0.05
        expected = (
            ("non-inferior" if d.mean() > -MARGIN else "inferior") if decided else "undecided"
        )
        assert v.verdict == expected
        assert v.excludes_effect == (not low <= PAPER_EFFECT[ham] <= high)
    nmf, _, cd = doc.primary
    assert nmf.verdict == "inferior"  # -0.05 with noise 0.01 on 6 replicates
    assert (cd.collapsed_one_step, cd.collapsed_bptt) == (0, 1)
    kept = [d for r, d in enumerate(diffs["cd"]) if r != 2]
    assert cd.without_collapses is not None
    assert cd.without_collapses.mean == pytest.approx(float(np.mean(kept)), abs=1e-12)


def test_power_matches_a_monte_carlo_of_the_paired_test() -> None:
    rng = np.random.default_rng(0)
    n, sd, trials = 20, 0.0125, 20000
    d = rng.normal(0.0, sd, size=(trials, n))
    t = (d.mean(1) + MARGIN) / (d.std(1, ddof=1) / math.sqrt(n))
    simulated = float((t > stats.t.ppf(1 - 0.05 / 3 / 2, n - 1)).mean())
    assert power(n, sd, MARGIN) == pytest.approx(simulated, abs=0.015)
    need = replicates_for(sd, MARGIN)
    assert need is not None and power(need, sd, MARGIN) >= 0.8 > power(need - 1, sd, MARGIN)


def _write_page(rows: dict[str, dict[str, Any]], tmp_path: Path) -> tuple[str, str]:
    csv = tmp_path / "v4.csv"
    write_rows(csv, rows, run.COLUMNS)
    docs = tmp_path / "docs"
    (docs / "results").mkdir(parents=True, exist_ok=True)
    (docs / "results.md").write_text("# Results\n\nolder text\n")
    (docs / "results" / "findings.md").write_text("<!-- header -->\n\n- older finding\n")
    v3 = tmp_path / "v3.csv"  # no v3 CSV: the page still renders (costs from this CSV)
    page = report.write(csv, docs, PLAN, v3_csv=v3)
    return page.read_text(), (docs / "results" / "findings.md").read_text()


@pytest.mark.parametrize("replicates", [1, 3])
def test_the_page_renders_partial_rows_with_verdicts_pending(
    replicates: int, tmp_path: Path
) -> None:
    rows, _ = _full_rows(replicates)
    page, findings = _write_page(rows, tmp_path)
    assert f"{replicates} of {PLAN.replicates} test replicates" in page
    assert "verdicts are pending" in page and "older text" in page
    assert page.index(report.BEGIN) < page.index("older text")  # at the top
    table = page[page.index("### Primary comparisons") : page.index("### Every primary arm")]
    assert "non-inferior after Holm" not in table and "inferior after Holm" not in table
    assert "verdicts pending" in findings and "older finding" in findings
    # regenerating gives the same page
    assert _write_page(rows, tmp_path)[0] == page


def test_the_page_renders_complete_rows_and_no_rows(tmp_path: Path) -> None:
    rows, _ = _full_rows(PLAN.replicates)
    page, findings = _write_page(rows, tmp_path)
    assert "all 6 test replicates" in page and "NMF inferior" in page
    assert "NMF one-step − BPTT (inv_t 1, K 6)" in findings
    with pytest.raises(ValueError, match="no measured job time"):
        _write_page({}, tmp_path / "empty")


TIMING = ("train_s", "peak_mem_mb", "started", "finished")


@pytest.mark.slow
def test_a_tiny_job_reruns_bit_for_bit_and_its_row_records_where_it_ran(tmp_path: Path) -> None:
    plan = Plan(replicates=2, tune_replicates=(7,), length_replicates=(0,),
                secondary_replicates=(0,), ks=(1,), main_epochs=1, test_size=4,
                pretrain_steps=2, pretrain_images=8,
                overrides=("data.train_size=4", "data.val_size=2", "batch_size=2"))  # fmt: skip
    job = Job("main", "vq", ONE_STEP, 6, 1.0, 0.1, 0, 1)
    pre = pretrain_jobs(plan)[1]
    out = tmp_path / "study"
    first = {j.key: run.run_job(j, plan, out) for j in (pre, job)}
    assert all(r["status"] == "ok" for r in first.values()), first
    csv = tmp_path / "rows.csv"
    write_rows(csv, first, run.COLUMNS)
    # the re-run command: a fresh folder, the replicate pretrained again, rows to the sidecar
    again = rerun.rerun([job.key], csv, tmp_path / "reruns", plan)
    assert [r["job"] for r in again] == [pre.key, job.key]
    assert len(list((tmp_path / "reruns").glob("rerun-*/pretrain/replicate0.pt"))) == 1
    for second in again:
        one = first[second["job"]]
        # every column a job computes, its identity and where it ran: bit for bit
        for column in run.COLUMNS:
            if column not in TIMING:
                assert one.get(column) == second.get(column), (second["job"], column)
    assert set(drift.METRICS) <= set(run.COLUMNS)
    row = first[job.key]
    assert all(row[c] is not None for c in drift.METRICS if c != "fidelity"), row
    assert row["cpu"] and row["cpu"] != "unknown" and row["threads"] == 1
    assert row["commit"] and row["torch"]  # "unknown" outside a git checkout
    back = read_rows(csv, run.COLUMNS)[job.key]
    assert (back["cpu"], back["threads"], back["test_miou"]) == (row["cpu"], 1, row["test_miou"])
    recorded = read_row_list(rerun.reruns_path(csv), run.COLUMNS)
    assert [r["test_miou"] for r in recorded] == [None, row["test_miou"]]
    measured = drift.pairs(read_rows(csv, run.COLUMNS), recorded, plan.digest())
    assert len(measured) == 2 and all(p.same_machine and p.identical for p in measured)
    text = drift.drift_summary(measured, first, str(csv), MARGIN)
    assert "not measured" in text and "2 of 2 bit-identical in every metric." in text


@pytest.mark.slow
def test_a_tiny_study_runs_end_to_end_resumes_and_renders(tmp_path: Path) -> None:
    plan = Plan(replicates=2, tune_replicates=(7,), lrs=(0.1,), length_replicates=(0,),
                secondary_replicates=(0,), secondary_inv_ts=(10.0,), ks=(1,), main_epochs=1,
                test_size=2, pretrain_steps=2, pretrain_images=8,
                overrides=("data.train_size=4", "data.val_size=2", "batch_size=2"))  # fmt: skip
    csv = tmp_path / "v4.csv"
    counts = run.run_study(plan, tmp_path / "out", csv, workers=1)
    rows = read_rows(csv, run.COLUMNS)
    assert counts["failed"] == 0 and counts["ran"] == len(rows) == len(all_jobs(plan, rows))
    assert all(r["status"] == "ok" and r["cpu"] and r["threads"] == 1 for r in rows.values())
    assert run.run_study(plan, tmp_path / "out", csv, workers=1)["ran"] == 0
    docs = tmp_path / "docs"
    page = report.write(csv, docs, plan, v3_csv=tmp_path / "absent.csv").read_text()
    assert "all 2 test replicates" in page


def test_the_drift_across_machines_is_computed_from_reruns_and_unmeasured_without(
    tmp_path: Path,
) -> None:
    rows, _ = _full_rows(PLAN.replicates)
    page, _ = _write_page(rows, tmp_path)
    assert "No job has been re-run yet (the study's" in page and "1 processor model" in page
    main = [r for r in rows.values() if r["stage"] == "main"]
    shifts = [0.003, -0.001]  # test mIoU of two jobs re-run on another processor
    reruns = [{**r, "cpu": "Other CPU", "test_miou": r["test_miou"] + d}
              for r, d in zip(main, shifts, strict=False)]  # fmt: skip
    reruns += [dict(main[2]),  # the same machine: identical
               {**main[3], "cpu": "Other CPU", "test_miou": 0.0, "status": "failed"},
               {**main[4], "cpu": "Other CPU", "test_miou": 0.0, "plan": "another"}]  # fmt: skip
    write_row_list(rerun.reruns_path(tmp_path / "v4.csv"), reruns, run.COLUMNS)
    page, _ = _write_page(rows, tmp_path)
    # independent arithmetic of the two cross-machine differences (re-run - study)
    deltas = [(main[i]["test_miou"] + d) - main[i]["test_miou"] for i, d in enumerate(shifts)]
    mean, largest = float(np.mean(np.abs(deltas))), float(np.max(np.abs(deltas)))
    assert (f"Drift across machines (Test CPU → Other CPU), 2 re-runs: |Δ test mIoU| mean "
            f"{mean:.2e}, largest {largest:.2e} over 2 jobs") in page  # fmt: skip
    assert "0 of 2 bit-identical" in page
    assert ("same processor model and thread count (1 comparison of 1 job): 1 of 1 "
            "bit-identical in every metric.") in page
    table = page[page.index("| job | study row: processor") :].split("\n\n")[0].splitlines()
    assert len(table) == 2 + 3  # header, rule, the three measured re-runs
    assert f"{deltas[0]:+.2e}" in table[2] and "Other CPU" in table[2]


def test_the_opening_line_carries_study_v3s_caveats_until_v4_is_complete() -> None:
    rng = np.random.default_rng(3)
    v3: dict[str, dict[str, Any]] = {}

    def add(context: str, gradient: str, inv_t: float | None, r: int, score: float) -> None:
        key = f"{context}-{gradient}-{inv_t}-{r}"
        v3[key] = {"job": key, "stage": "main", "context": context, "gradient": gradient,
                   "K": 0 if context == "none" else 6, "inv_t": inv_t, "replicate": r,
                   "status": "ok", "test_miou": score}  # fmt: skip

    floor = [0.60, 0.61, 0.62, 0.63]
    diffs = {"nmf": rng.normal(-0.05, 0.005, 4), "vq": rng.normal(0.0, 0.01, 4),
             "cd": rng.normal(0.02, 0.002, 4)}  # fmt: skip
    for r, f in enumerate(floor):
        add("none", NO_GRADIENT, None, r, f)
        for ham in HAMS:
            inv_t = None if ham == "nmf" else 1.0
            add(ham, BPTT, inv_t, r, 0.8)
            add(ham, ONE_STEP, inv_t, r, 0.8 + float(diffs[ham][r]))
        # at inv_t 100: VQ's BPTT below the floor on replicates 0 and 2, CD's never
        add("vq", BPTT, 100.0, r, f - 0.1 if r in (0, 2) else f + 0.1)
        add("cd", BPTT, 100.0, r, f + 0.05)
    rows, _ = _full_rows(2)
    doc = report.paper_v4(rows, PLAN, "x.csv", v3)
    line = doc.conclusions[0]
    assert line.startswith("One-step as good as BPTT at the paper's settings: pending")
    assert "(VQ inv_t 100: 2 of 4)" in line and "CD inv_t 100" not in line
    for ham in HAMS:
        d = diffs[ham]
        low, high = stats.t.interval(0.95, len(d) - 1, loc=d.mean(), scale=stats.sem(d))
        assert f"{ham.upper()} {d.mean():+.3f} [{low:+.3f}, {high:+.3f}] (n=4)" in line
        excluded = f"the paper's +{PAPER_EFFECT[ham]:.3f} excluded"
        assert (excluded in line) == (high < PAPER_EFFECT[ham]), ham
    assert doc.v3_replicates == 4 and doc.v3_failed == "VQ inv_t 100: 2 of 4"
    # complete v4 rows: the line is v4's verdicts alone
    complete = report.paper_v4(_full_rows(PLAN.replicates)[0], PLAN, "x.csv", v3)
    assert "study v3" not in complete.conclusions[0] and "NMF inferior" in complete.conclusions[0]


def _t_verdict(diffs: list[float]) -> str:
    mean, se = float(np.mean(diffs)), float(np.std(diffs, ddof=1)) / math.sqrt(len(diffs))
    half = stats.t.ppf(0.975, len(diffs) - 1) * se
    return ("non-inferior" if mean - half > -MARGIN
            else "inferior" if mean + half < -MARGIN else "undecided")  # fmt: skip


def test_the_length_check_says_which_verdicts_move_against_scipy() -> None:
    rows, diffs = _full_rows(PLAN.replicates)
    main = jobs_of_stage(PLAN, rows, "main")
    longer = jobs_of_stage(PLAN, rows, "length")
    assert {j.replicate for j in longer} == set(PLAN.length_replicates)
    table, line = report._length_table(PLAN, rows, main, longer)
    assert "pending (0 of 3 hams" in line
    # at twice the length: NMF's gap closes (one-step 0.001, 0.002 above BPTT), VQ and CD
    # keep their main-length differences
    closed = {0: 0.001, 1: 0.002}
    for job in longer:
        ham, r = job.context, job.replicate
        same = diffs[ham][r] if ham != "nmf" else closed[r]
        rows[job.key] = _row(job, test_miou=0.8 + (same if job.gradient == ONE_STEP else 0.0))
    table, line = report._length_table(PLAN, rows, main, longer)
    expected = {}
    for ham in HAMS:
        short = [diffs[ham][r] for r in PLAN.length_replicates]
        long = short if ham != "nmf" else list(closed.values())
        expected[ham] = (_t_verdict(short), _t_verdict(long))
    moves = {row[0]: row[-1] for row in table.rows}
    assert moves == {h.upper(): "yes" if a != b else "no" for h, (a, b) in expected.items()}
    assert moves["VQ"] == moves["CD"] == "no"
    assert expected["nmf"] == ("undecided", "non-inferior")  # at these synthetic rows
    assert line.endswith("the verdict moves for NMF (undecided → non-inferior).")


def test_the_conclusions_say_on_which_side_of_zero_each_interval_lies() -> None:
    over_gap = {"NMF, bptt": Interval(0.02, 0.01, 0.03, 20),
                "VQ, bptt": Interval(0.0, -0.01, 0.01, 20),
                "CD, one-step": Interval(-0.02, -0.03, -0.01, 20), "CD, bptt": None}  # fmt: skip
    line = conclusions.gap_line(over_gap)
    assert "above GAP: NMF, bptt +0.020" in line and "below GAP: CD, one-step -0.020" in line
    assert "not distinguishable from GAP: VQ, bptt" in line and "CD, bptt" not in line
    rows, _ = _full_rows(PLAN.replicates)
    primary = primary_comparisons(PLAN, rows, jobs_of_stage(PLAN, rows, "main"))
    gap = {"NMF, bptt": Interval(0.02, 0.01, 0.03, 6), "VQ, bptt": Interval(0.0, -0.01, 0.01, 6)}
    first = conclusions.one_step_line(PLAN, primary, gap)
    for v in primary:
        assert v.interval is not None
        below = v.verdict == "non-inferior" and v.interval.upper < 0
        assert f"{v.ham.upper()} {v.verdict}{' but below BPTT' if below else ''}, " in first
    # NMF's synthetic difference (TRUE) lies far below its paper effect; VQ's is near 0 with 6
    # replicates and CD's interval is widened by its collapsed replicate
    assert "NMF inferior, " in first and "is excluded for NMF, not for VQ, CD;" in first
    # no arm of VQ or CD above GAP: the line says that the decomposition adds nothing there
    assert first.endswith("neither arm of VQ, CD lies above global average pooling, so there the "
                          "gradients are compared where the decomposition adds nothing "
                          "measurable beyond a global summary.")


def test_a_row_at_a_rate_the_tuning_does_not_select_is_listed_and_used_nowhere(
    tmp_path: Path,
) -> None:
    rows, diffs = _full_rows(PLAN.replicates)
    main = jobs_of_stage(PLAN, rows, "main")
    job = next(j for j in main if j.context == "nmf" and j.gradient == BPTT and j.replicate == 0)
    stray = Job(job.stage, job.context, job.gradient, job.K, job.inv_t, 0.025, 0, job.epochs)
    assert stray.key not in {j.key for j in main}
    rows[stray.key] = _row(stray, test_miou=0.123456, val_miou=0.1, started=1e9, finished=1e9)
    assert report._outside(PLAN, rows) == (f"`{stray.key}` (test mIoU 0.123)",)
    rows[stray.key]["started"] = 0.0  # before the last tuning row ended (synthetic: at 60 s)
    assert report._outside(PLAN, rows) == (
        f"`{stray.key}` (test mIoU 0.123, started before the tuning's last row ended)",)
    nmf = next(v for v in primary_comparisons(PLAN, rows, main) if v.ham == "nmf")
    assert nmf.interval is not None and nmf.interval.mean == pytest.approx(np.mean(diffs["nmf"]))
    page, _ = _write_page(rows, tmp_path)
    assert "Rows of this plan that are among none of its jobs" in page and stray.key in page
    # the exploratory comparisons have no rows here: no pair, no count
    table = page[page.index("### Exploratory") : page.index("### Reproducibility")]
    assert "| – | – |" in table and "| – | 0 |" not in table
