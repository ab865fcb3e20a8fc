"""Generation v3's plan (arms paired by seed, the pilot a prefix of the main sweep), the gate read
from rows against an independent interval, the plateau check, the page with zero and partial rows,
and the runner skipping jobs whose rows exist."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest
import torch
from scipy import stats

from experiments.engine.file_sinks import read_jsonl
from experiments.engine.provenance import cpu_model, library_commit
from experiments.studies.generation_v3 import run as study_run
from experiments.studies.generation_v3.checks import (
    extrapolated,
    failure_note,
    plateau_check,
    rerun_check,
)
from experiments.studies.generation_v3.figures import mean_curve, projected_minutes
from experiments.studies.generation_v3.plan import ARMS, Job, Plan, job_overrides
from experiments.studies.generation_v3.report import (
    answers,
    gate,
    plateau_change,
    provenance_summary,
    read_rows,
    verdicts,
    write_page,
)


def test_the_plan_pairs_every_arm_on_each_seed() -> None:
    plan = Plan()
    assert len(plan.seeds) >= 6 and len(plan.pilot_seeds) >= 3
    jobs = plan.main_jobs()
    assert len(jobs) == len(ARMS) * len(plan.seeds)
    assert {j.key for j in plan.pilot_jobs()} <= {j.key for j in jobs}
    for seed in plan.seeds:
        for arm in ARMS:
            overrides = job_overrides(Job(arm, seed), plan)
            # the seed fixes the batches, the canvases and the shared weights of every arm alike
            for key in ("seed", "data.seed", "model.init_seed"):
                assert f"{key}={seed}" in overrides
    assert "context.rank=8" in job_overrides(Job("nmf_one_step", 0), plan)
    assert not any("context." in o for o in job_overrides(Job("self_attention", 0), plan))


def test_the_plan_rejects_a_pilot_that_is_not_a_prefix() -> None:
    with pytest.raises(ValueError, match="pilot_seeds"):
        Plan(seeds=(0, 1, 2, 3, 4, 5), pilot_seeds=(1, 2, 3))


def test_the_plateau_change_over_the_last_fifth() -> None:
    curve = [10.0, 8.0, 6.0, 5.0, 4.0, 4.0, 4.0, 4.0, 3.9, 3.8]
    assert plateau_change(curve, 0.2) == pytest.approx(0.2 / 4.0)
    assert plateau_change([1.0], 0.2) is None


def _row(arm: str, seed: int, loss: float, plan: Plan) -> dict[str, object]:
    return {"job": Job(arm, seed).key, "arm": arm, "seed": seed, "plan": plan.digest(),
            "status": "ok", "val_loss": loss, "at_plateau": True, "gamma": 1.0,
            "time_per_step_s": 0.05, "peak_memory_mb": 300.0, "curve": [],
            "train_time_s": 60.0}  # fmt: skip


def test_the_gate_is_the_paired_t_interval_of_the_losses() -> None:
    plan = Plan()
    none, attention = [4.7, 4.8, 4.75], [3.1, 3.3, 3.0]
    rows = [_row("none", s, v, plan) for s, v in enumerate(none)]
    rows += [_row("self_attention", s, v, plan) for s, v in enumerate(attention)]
    diffs = [a - b for a, b in zip(none, attention, strict=True)]
    half = stats.t.ppf(0.975, 2) * statistics.stdev(diffs) / math.sqrt(3)
    result = gate(rows, plan)
    assert result.interval is not None and result.passed
    assert result.interval.low == pytest.approx(statistics.fmean(diffs) - half)
    failing = [_row("none", s, v, plan) for s, v in enumerate(none)]
    failing += [_row("self_attention", s, v + 0.05, plan) for s, v in enumerate(none)]
    assert not gate(failing, plan).passed
    assert not gate(rows[:1] + rows[3:4], plan).passed  # one seed: no interval


def test_the_page_renders_with_zero_and_with_partial_rows(tmp_path: Path) -> None:
    plan = Plan()
    empty = write_page(tmp_path / "none.jsonl", tmp_path / "empty.md", plan).read_text()
    assert "Nothing has run yet" in empty and "not run yet" in empty
    results = tmp_path / "rows.jsonl"
    rows = [_row("none", s, 4.7 + 0.01 * s, plan) for s in range(3)]
    rows += [_row("self_attention", s, 3.0 + 0.02 * s, plan) for s in range(3)]
    results.write_text("".join(json.dumps(r) + "\n" for r in rows))
    page = write_page(results, tmp_path / "partial.md", plan, tmp_path / "none.jsonl").read_text()
    assert "6 of 36 jobs have run" in page and "nmf_one_step-s0" in page
    assert "passed" in page
    assert "| no context | 3 / 6 | 4.710 |" in page  # mean of 4.70, 4.71, 4.72
    assert "pilot's jobs included, 6 min" in page and "that is 3 wall minutes" in page
    assert (tmp_path / "partial" / "loss_curves.png").stat().st_size > 0


def test_the_answers_are_the_paired_intervals_of_each_question() -> None:
    plan = Plan(seeds=(0, 1, 2))
    one_step, bptt = [4.4, 4.5, 4.3], [2.8, 2.82, 2.81]
    rows = [_row("nmf_one_step", s, v, plan) for s, v in enumerate(one_step)]
    rows += [_row("nmf_unroll", s, v, plan) for s, v in enumerate(bptt)]
    rows += [_row("self_attention", s, 2.9, plan) for s in range(3)]
    diffs = [b - a for a, b in zip(one_step, bptt, strict=True)]
    half = stats.t.ppf(0.975, 2) * statistics.stdev(diffs) / math.sqrt(3)
    mean = statistics.fmean(diffs)
    lines = answers(rows, plan)
    assert len(lines) == 6  # four Hamburger arms against attention, two gradients against BPTT
    assert lines[4] == (
        "Hamburger NMF, one-step gradient (HamGAN) against Hamburger NMF, BPTT: worse (held-out "
        f"loss of the second minus the first: {mean:+.3f} [{mean - half:+.3f}, {mean + half:+.3f}]"
        ", 3 seeds)."
    )
    assert lines[1].startswith("Hamburger NMF, BPTT against self-attention (SAGAN): better")
    assert lines[2].endswith("not enough paired seeds yet.")  # no implicit rows


def test_a_job_off_its_plateau_is_extrapolated_and_the_answers_rechecked() -> None:
    plan = Plan(seeds=(0, 1, 2))  # plateau_share 0.2: over 10 points, the last fifth is 2 steps
    curve = [[64 * (k + 1), 3.0 - 0.1 * k] for k in range(10)]  # falls 0.2 over the last fifth
    rows = [_row("nmf_unroll", s, 1.5, plan) for s in range(3)]
    rows += [_row("nmf_one_step", s, 1.6 + 0.01 * s, plan) for s in range(3)]
    assert plateau_check(rows, plan, verdicts) == "Every one of the 6 jobs reached a plateau."
    assert extrapolated(rows[3] | {"curve": curve}, plan)["val_loss"] == pytest.approx(0.6)
    flat = rows[3] | {"at_plateau": False, "plateau_change": 0.015, "curve": curve[:2] * 5}
    text = plateau_check([*rows[:3], flat, *rows[4:]], plan, verdicts)
    assert text.startswith("1 of 6 jobs did not reach a plateau") and "-s0 (1.5 %)" in text
    assert "changes none of the answers above" in text  # a flat curve extrapolates to itself
    # one-step worse than BPTT by 0.10-0.12 on every seed; seed 0 extrapolated to 0.6 is not
    steep = rows[3] | {"at_plateau": False, "plateau_change": 0.2 / 2.3, "curve": curve}
    text = plateau_check([*rows[:3], steep, *rows[4:]], plan, verdicts)
    assert "nmf_one_step-s0 (8.7 %)" in text
    assert "Hamburger NMF, one-step gradient (HamGAN) against Hamburger NMF, BPTT becomes" in text


def test_an_arm_failing_its_check_on_most_steps_is_named_with_its_counts() -> None:
    plan = Plan(seeds=(0, 1, 2), pilot_seeds=(0, 1))
    rows = [_row(arm, s, 2.0, plan) | {"steps": 100, "failures": failures}
            for arm, failures in (("nmf_implicit", 100), ("nmf_unroll", 0), ("vq_one_step", 40))
            for s in (0, 1)]  # fmt: skip
    note = failure_note(rows, plan, plan.digest(), "main stage")
    assert note.startswith("Hamburger NMF, implicit gradient, main stage: 200 of its 200 training")
    assert "VQ" not in note and "BPTT" not in note  # 40 % of steps, and none: not named
    assert failure_note(rows, plan, "another plan", "main stage") == ""


def test_the_projection_takes_each_arms_fastest_job() -> None:
    rows = [{"arm": "a", "train_time_s": t} for t in (120.0, 60.0, 600.0)]
    rows += [{"arm": "b", "train_time_s": 30.0}]
    assert projected_minutes(rows, jobs_per_arm=4) == pytest.approx((60 + 30) * 4 / 60)


def test_a_rerun_is_compared_with_the_row_it_replaces(tmp_path: Path) -> None:
    plan = Plan()
    path = tmp_path / "results.jsonl"
    assert rerun_check(path, plan.digest()) == ""
    first = [_row("none", 0, 4.5, plan), _row("nmf_implicit", 0, 2.9, plan)]
    again = [_row("none", 0, 4.5, plan) | {"commit": "bbb"},
             _row("nmf_implicit", 0, 2.93, plan) | {"commit": "bbb"}]  # fmt: skip
    other = [_row("none", 0, 9.0, plan) | {"plan": "another"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in first + other))
    assert rerun_check(path, plan.digest()) == ""  # one row per job of this plan
    path.write_text("".join(json.dumps(r) + "\n" for r in first + other + again))
    text = rerun_check(path, plan.digest())
    assert text.startswith("Re-runs: 2 rows re-ran a job") and "1 reproduced" in text
    assert "Hamburger NMF, implicit gradient by up to 0.0300" in text
    assert "library commits not recorded to bbb" in text and "no context by" not in text


def test_the_curves_are_averaged_step_by_step_over_seeds() -> None:
    rows = [{"curve": [[64, 4.0], [128, 3.0], [192, 2.0]]}, {"curve": [[64, 5.0], [128, 4.0]]}]
    assert mean_curve(rows) == ([64, 128, 192], [4.5, 3.5, 2.0])


def test_the_runner_skips_jobs_with_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plan = Plan()
    results = tmp_path / "rows.jsonl"
    results.write_text(json.dumps(_row("none", 0, 4.7, plan)) + "\n")
    ran: list[str] = []

    def fake(job: Job, plan_: Plan, out: Path) -> dict[str, object]:
        ran.append(job.key)
        return _row(job.arm, job.seed, 4.0, plan_)

    monkeypatch.setattr(study_run, "run_job", fake)
    assert study_run.run_stage("pilot", tmp_path, results, plan, workers=1) == 5
    assert "none-s0" not in ran and len(ran) == 5
    assert len(read_rows(results)) == 6
    with pytest.raises(SystemExit, match="gate"):  # all losses 4.0 vs 4.0 / 4.7: not passed
        study_run.run_stage("main", tmp_path, results, plan, workers=1)


def test_a_tiny_job_gives_its_row_through_the_engine(tmp_path: Path) -> None:
    plan = Plan(seeds=(0,), pilot_seeds=(0,), epochs=2, rank=2, ham_steps=2,
                overrides=("data.train_size=64", "data.val_size=32", "batch_size=32",
                           "model.width=8"))  # fmt: skip
    threads = torch.get_num_threads()
    try:
        row = study_run.run_job(Job("nmf_one_step", 0), plan, tmp_path)
    finally:
        torch.set_num_threads(threads)
    metrics = read_jsonl(tmp_path / "jobs" / "nmf_one_step-s0" / "metrics.jsonl")
    assert [loss for _, loss in row["curve"]] == [m["val/loss"] for m in metrics if "val/loss" in m]
    assert row["steps"] == 4 and len(row["curve"]) == 2  # 2 epochs of 64 / 32 batches
    assert row["val_loss"] == row["curve"][-1][1]
    assert math.isfinite(row["gamma"]) and row["peak_memory_mb"] > 0
    assert row["plan"] == plan.digest()
    assert row["commit"] == library_commit() and row["cpu"] == cpu_model()
    assert int(row["threads"]) >= 1 and row["torch"] == torch.__version__


def test_the_page_says_where_its_rows_ran(tmp_path: Path) -> None:
    plan = Plan()
    rows = [_row("none", 0, 4.7, plan) | {"commit": "abc", "cpu": "X"},
            _row("none", 1, 4.7, plan) | {"commit": "abc", "cpu": "X"},
            _row("self_attention", 0, 3.0, plan)]  # fmt: skip
    assert provenance_summary(rows) == "commit abc on X: 2 row(s); not recorded: 1 row(s)"
    results = tmp_path / "rows.jsonl"
    results.write_text("".join(json.dumps(r) + "\n" for r in rows))
    page = write_page(results, tmp_path / "page.md", plan).read_text()
    assert "Where the rows ran (processor and library commit): commit abc on X: 2 row(s)" in page


def _pairing_row(arm: str, seed: int, accuracy: float, plan: Plan) -> dict[str, object]:
    return {"job": Job(arm, seed).key, "arm": arm, "seed": seed, "plan": plan.pairing_digest(),
            "status": "ok", "balanced_accuracy": accuracy, "gamma": 1.0,
            "time_per_step_s": 0.02, "curve": [], "train_time_s": 30.0}  # fmt: skip


def test_the_pairing_stage_pairs_every_arm_over_eight_seeds() -> None:
    plan = Plan()
    assert len(plan.pairing_seeds) >= 8
    assert len(plan.pairing_jobs()) == len(ARMS) * len(plan.pairing_seeds)
    overrides = job_overrides(Job("vq_one_step", 5), plan, pairing=True)
    assert "+experiment=generation_v3_pairing" in overrides
    for key in ("seed", "data.seed", "model.init_seed"):
        assert f"{key}=5" in overrides
    assert f"epochs={plan.pairing_epochs}" in overrides and "context.rank=8" in overrides
    assert plan.pairing_digest() != plan.digest()


def test_the_pairing_tables_give_mean_sd_seeds_and_the_paired_interval(tmp_path: Path) -> None:
    plan = Plan()
    none = [0.50, 0.51, 0.49, 0.50, 0.52, 0.48, 0.50, 0.51]
    attention = [0.78, 0.74, 0.80, 0.77, 0.75, 0.79, 0.76, 0.78]
    rows = [_pairing_row("none", s, v, plan) for s, v in enumerate(none)]
    rows += [_pairing_row("self_attention", s, v, plan) for s, v in enumerate(attention)]
    pairing = tmp_path / "pairing.jsonl"
    pairing.write_text("".join(json.dumps(r) + "\n" for r in rows))
    page = write_page(tmp_path / "none.jsonl", tmp_path / "page.md", plan, pairing).read_text()
    mean_sd = f"{statistics.fmean(attention):.3f} ± {statistics.stdev(attention):.3f}"
    assert f"| self-attention (SAGAN) | 8 / 8 | {mean_sd} |" in page
    assert ", ".join(f"{v:.3f}" for v in none) in page
    test = stats.ttest_rel(attention, none)
    ci = test.confidence_interval(0.95)
    mean = statistics.fmean(a - b for a, b in zip(attention, none, strict=True))
    expected = f"| 8 | {mean:+.3f} [{ci.low:+.3f}, {ci.high:+.3f}] | better |"
    assert expected in page
    assert "16 of 48 jobs have run" in page


def test_the_pairing_runner_skips_jobs_with_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = Plan(seeds=(0,), pilot_seeds=(0,), pairing_seeds=(0, 1))
    results = tmp_path / "pairing.jsonl"
    results.write_text(json.dumps(_pairing_row("none", 0, 0.5, plan)) + "\n")
    ran: list[str] = []

    def fake(job: Job, plan_: Plan, out: Path) -> dict[str, object]:
        ran.append(job.key)
        return _pairing_row(job.arm, job.seed, 0.5, plan_)

    monkeypatch.setattr(study_run, "run_pairing_job", fake)
    assert study_run.run_stage("pairing", tmp_path, results, plan, workers=1) == 11
    assert "none-s0" not in ran and len(read_rows(results)) == 12
    assert study_run.run_stage("pairing", tmp_path, results, plan, workers=1) == 0


def test_a_tiny_pairing_job_gives_its_row_through_the_engine(tmp_path: Path) -> None:
    plan = Plan(seeds=(0,), pilot_seeds=(0,), pairing_seeds=(0,), pairing_epochs=2, rank=2,
                ham_steps=2, overrides=("data.train_size=64", "data.val_size=32",
                                        "batch_size=32", "model.width=8"))  # fmt: skip
    threads = torch.get_num_threads()
    try:
        row = study_run.run_pairing_job(Job("nmf_one_step", 0), plan, tmp_path)
    finally:
        torch.set_num_threads(threads)
    metrics = read_jsonl(tmp_path / "pairing" / "nmf_one_step-s0" / "metrics.jsonl")
    accuracies = [m["val/accuracy"] for m in metrics if "val/accuracy" in m]
    assert [a for _, a in row["curve"]] == accuracies and len(accuracies) == 2
    assert row["balanced_accuracy"] == accuracies[-1]
    assert row["best_balanced_accuracy"] == max(accuracies)
    assert row["steps"] == 4 and row["plan"] == plan.pairing_digest()
    first, last = (m["val/loss"] for m in metrics if "val/loss" in m)
    assert row["plateau_change"] == pytest.approx(abs(last - first) / first)
    assert row["at_plateau"] == (row["plateau_change"] < plan.plateau_tol)
    assert math.isfinite(row["gamma"]) and row["peak_memory_mb"] > 0


def _sampled(arm: str, seed: int, kappa: float, fid: float, plan: Plan) -> dict[str, object]:
    scores = {"consistency": kappa, "kappa": kappa, "fid": fid, "kid": fid / 10,
              "precision": 0.5, "recall": 0.25}  # fmt: skip
    real = {"consistency": 0.9, "kappa": 1.0, "fid": 3.0 + seed, "kid": 0.1, "precision": 0.8,
            "recall": 0.8}  # fmt: skip
    return _row(arm, seed, 4.0, plan) | {"samples": scores, "samples_real": real,
                                         "classifier": {"val_accuracy": 0.97}}  # fmt: skip


def test_the_sample_tables_give_mean_sd_the_real_row_and_paired_intervals(
    tmp_path: Path,
) -> None:
    plan = Plan()
    kappa_none, kappa_att = [0.01, 0.03, 0.02], [0.5, 0.7, 0.65]
    fid_none, fid_att = [40.0, 44.0, 41.0], [20.0, 21.0, 25.0]
    rows = [_sampled("none", s, kappa_none[s], fid_none[s], plan) for s in range(3)]
    rows += [_sampled("self_attention", s, kappa_att[s], fid_att[s], plan) for s in range(3)]
    rows.append(_row("nmf_one_step", 0, 4.0, plan))  # an old row: not measured
    results = tmp_path / "rows.jsonl"
    results.write_text("".join(json.dumps(r) + "\n" for r in rows))
    page = write_page(results, tmp_path / "page.md", plan).read_text()
    sd = statistics.stdev(kappa_att)
    assert f"| self-attention (SAGAN) | 3 / 6 | {statistics.fmean(kappa_att):.3f} ± {sd:.3f} |" \
        in page  # fmt: skip
    assert "| Hamburger NMF, one-step gradient (HamGAN) | 0 / 6 | not measured |" in page
    real = "| real held-out cells (reference) | 3 / 6 | 0.900 ± 0.000 | 1.000 ± 0.000 | 4.00 ± 1.00"
    assert real in page
    assert "6 of the rows have sample metrics" in page

    def text(diffs: list[float]) -> str:
        half = stats.t.ppf(0.975, 2) * statistics.stdev(diffs) / math.sqrt(3)
        m = statistics.fmean(diffs)
        return f"{m:+.3f} [{m - half:+.3f}, {m + half:+.3f}]"

    kappa = text([a - b for a, b in zip(kappa_att, kappa_none, strict=True)])
    fid = text([b - a for a, b in zip(fid_att, fid_none, strict=True)])  # lower FID is better
    assert f"| self-attention (SAGAN) | no context | 3 | {kappa} | {kappa} | {fid} |" in page


def test_a_tiny_job_has_sample_metrics_and_the_samples_stage_backfills_them(
    tmp_path: Path,
) -> None:
    plan = Plan(seeds=(0, 1), pilot_seeds=(0,), epochs=2, rank=2, ham_steps=2,
                overrides=("data.train_size=64", "data.val_size=64", "batch_size=32",
                           "model.width=8"))  # fmt: skip
    threads = torch.get_num_threads()
    try:
        row = study_run.run_job(Job("self_attention", 0), plan, tmp_path)
    finally:
        torch.set_num_threads(threads)
    assert "samples_error" not in row
    assert set(row["samples"]) == {"consistency", "kappa", "fid", "kid", "precision", "recall"}
    assert row["samples_real"]["kappa"] == 1.0 and row["classifier"]["val_accuracy"] > 0.9
    assert list((tmp_path / "classifiers").iterdir())  # cached for the seed's other jobs
    results = tmp_path / "rows.jsonl"
    old = {k: v for k, v in row.items() if k not in ("samples", "samples_real", "classifier")}
    missing = _row("none", 1, 4.0, plan)  # no checkpoint on disk: left as it is
    results.write_text(json.dumps(old) + "\n" + json.dumps(missing) + "\n")
    assert study_run.backfill_samples(tmp_path, results, plan) == 1
    filled = {r["job"]: r for r in read_rows(results)}
    assert filled["self_attention-s0"]["samples"] == row["samples"]
    assert filled["self_attention-s0"]["val_loss"] == row["val_loss"]
    assert "samples" not in filled["none-s1"]
    assert study_run.backfill_samples(tmp_path, results, plan) == 0  # nothing left to fill
