"""The public-benchmark study: its plan (arms, seeds, equal budgets), a tiny resumable run
through the engine, and the page with zero and partial rows."""

from __future__ import annotations

import math
import statistics
import warnings
from pathlib import Path

import pytest
import torch

import implicit_ham as ih
from experiments.engine.build import build_datasets, build_model
from experiments.engine.checkpoint import read_checkpoint
from experiments.studies.csv_rows import append_session, encode_curve, read_rows, write_rows
from experiments.studies.job_row import compose_overrides
from experiments.studies.sequence_benchmarks import report, run
from experiments.studies.sequence_benchmarks.plan import (
    ATTENTION_RUNS,
    ATTENTION_SOLVED_AT,
    BUDGET_MINUTES,
    EPOCH_S,
    H3_TASKS,
    TIERS,
    Plan,
    cost,
    jobs,
)
from experiments.studies.sequence_benchmarks.run import (
    COLUMNS,
    JOB_SETTINGS,
    deq_spectral_radius,
    job_row,
    run_study,
)


def test_plan_arms_seeds_and_equal_budgets() -> None:
    plan = Plan()
    planned = jobs(plan)
    assert len({j.key for j in planned}) == len(planned)
    by_task: dict[str, set[str]] = {}
    for job in planned:
        by_task.setdefault(job.benchmark, set()).add(job.arm)
    hams = {f"{h}_{a}" for h in ("nmf", "vq", "cd") for a in ("one_step", "unroll", "implicit")}
    for task in H3_TASKS:
        base = {"attention", "attention_bidirectional", "linear_attention", "none"}
        assert by_task[task] == base | hams
    deq = {f"deq_{a}_{s}" for a in ("unroll", "one_step", "phantom", "neumann", "implicit")
           for s in ("none", "spectral")}  # fmt: skip
    assert by_task["mnist1d"] == {"mlp", "cnn", "gru"} | deq
    assert by_task["mnist1d_shuffled"] == {
        "none",
        "self_attention",
        "nmf_one_step",
        "nmf_bptt",
        "vq",
        "cd",
    }
    for task, arms in by_task.items():  # >= 3 seeds of every arm
        for arm in arms:
            seeds = {j.seed for j in planned if j.benchmark == task and j.arm == arm}
            assert seeds == {0, 1, 2}, (task, arm)
    for job in planned:
        assert "stop_at_accuracy=1.0" in job.overrides  # early stop for every arm
        assert f"epochs={job.epochs}" in job.overrides
        if job.benchmark in H3_TASKS:  # only the published attention row is causal
            assert ("context.causal=true" in job.overrides) == (job.arm == "attention")
        if job.benchmark in H3_TASKS and job.arm == "attention":
            assert job.epochs == H3_TASKS[job.benchmark]  # the published epochs
        elif job.benchmark in H3_TASKS:  # equal wall time: the largest cap inside arm_seconds
            share = 22 / 31 if job.benchmark == "h3_associative_recall" else 1.0
            per_epoch = EPOCH_S.get(f"h3/{job.arm}", EPOCH_S[job.family]) * share
            assert job.epochs * per_epoch <= plan.arm_seconds < (job.epochs + 1) * per_epoch
        elif job.arm in ("mlp", "cnn", "gru") and job.benchmark == "mnist1d":
            assert job.epochs == plan.sanity_epochs and "optim.lr=1e-2" in job.overrides
        else:
            assert job.epochs == plan.mnist_epochs


def test_plan_runs_the_priority_rows_first_and_projects_the_budget() -> None:
    """Jobs run tier by tier (attention, then the one-step Hamburger mixers, then the MNIST-1D
    sanity rows ...), seed-major inside a tier; the projection is the jobs' measured seconds
    summed per tier over 2 workers, and the top two tiers end inside the 120-minute budget."""
    plan = Plan()
    planned = jobs(plan)
    assert [j.tier for j in planned] == sorted(j.tier for j in planned)
    first = {j.tier: j for j in reversed(planned)}
    assert first[1].arm == "attention"
    assert {j.arm for j in planned if j.tier == 2} == {
        "nmf_one_step",
        "vq_one_step",
        "cd_one_step",
        "attention_bidirectional",
    }
    assert {j.arm for j in planned if j.tier == 3} == {"mlp", "cnn", "gru"}
    for tier in TIERS:
        seeds = [j.seed for j in planned if j.tier == tier]
        assert seeds == sorted(seeds), tier
    projected = cost(plan)
    assert [t.tier for t in projected] == sorted(TIERS)
    ends = 0.0
    for t in projected:
        mine = [j for j in planned if j.tier == t.tier]
        worst = sum(
            j.epochs
            * EPOCH_S.get(f"{j.family.split('/')[0]}/{j.arm}", EPOCH_S[j.family])
            * (22 / 31 if j.benchmark == "h3_associative_recall" else 1.0)
            for j in mine
        )
        assert math.isclose(t.worst, worst / 60 / 2) and t.expected <= t.worst
        ends += t.expected
        assert math.isclose(t.ends_at, ends) and t.fits == (ends <= BUDGET_MINUTES)
    assert projected[0].fits and projected[1].fits  # the reproduction and the thesis rows
    assert not projected[-1].fits  # the whole plan does not fit: the page says so
    only = Plan(tiers=(1, 3))
    assert {j.tier for j in jobs(only)} == {1, 3} and [t.tier for t in cost(only)] == [1, 3]


def test_the_digest_names_the_jobs_not_which_tiers_run() -> None:
    """A run of tiers 1-2 and a later run of the whole plan write rows of one plan (the
    selection does not change a job); an option that changes jobs changes the digest."""
    whole = Plan()
    assert Plan(tiers=(1, 2)).digest() == whole.digest()
    assert Plan(benchmarks=("mnist1d",), tiers=(3,)).digest() == whole.digest()
    assert {j.key for j in jobs(Plan(tiers=(1, 2)))} < {j.key for j in jobs(whole)}
    assert Plan(arm_seconds=180.0).digest() != whole.digest()
    assert Plan(seeds=(0, 1)).digest() != whole.digest()


def test_runner_projection_and_stop(tmp_path: Path) -> None:
    """--cost prints each tier against the budget; --stop-after-minutes 0 starts no job."""
    text = run.projection_text(Plan())
    assert "tier 1 (attention" in text and "inside the 120-minute budget" in text
    assert "beyond the 120-minute budget" in text
    counts = run_study(TINY, tmp_path / "out", tmp_path / "runs.csv", 1, stop_after_minutes=0)
    assert counts == {"ran": 0, "failed": 0, "skipped": 0}


@pytest.mark.parametrize(
    ("curve", "want"),
    [
        ([(1, 0.2), (2, 0.6), (3, 1.0)], "solved at epoch 3"),
        ([(1, 0.2), (2, 0.3), (3, 0.3)], "too short (3 epochs)"),
        ([(1, 0.2), (2, 0.5), (3, 0.6), (4, 0.6), (5, 0.603), (6, 0.598)], "plateaued (+0.3"),
        ([(1, 0.2), (2, 0.3), (3, 0.4), (4, 0.5), (5, 0.55), (6, 0.6)], "rising (+10.0"),
    ],
)
def test_learning_status(curve: list[tuple[int, float]], want: str) -> None:
    # plateau: best of the last 2 epochs 0.603 vs best before 0.600 -> +0.3 points
    # rising: best of the last 2 epochs 0.6 vs best before 0.5 -> +10 points
    assert report.learning_status(curve).startswith(want)


TINY = Plan(
    seeds=(0,), arm_seconds=1.0, attention_epochs=2, benchmarks=("h3_associative_recall",),
    overrides=("data.num_examples=24", "data.num_test_examples=8", "model.width=16"),
)  # fmt: skip


def test_tiny_run_is_resumable_and_renders(tmp_path: Path) -> None:
    csv = tmp_path / "runs.csv"
    empty = report.render(report.build({}, TINY, str(csv), []))
    assert "0 of 13 jobs have run" in empty and "pending (0 of 1 seeds" in empty
    counts = run_study(TINY, tmp_path / "out", csv, workers=1)
    assert counts == {"ran": 13, "failed": 0, "skipped": 0}
    rows = read_rows(csv, COLUMNS)
    assert all(r["status"] == "ok" and r["commit"] for r in rows.values())
    again = run_study(TINY, tmp_path / "out", csv, workers=1)
    assert again == {"ran": 0, "failed": 0, "skipped": 13}
    # partial: drop one arm's row; the page says it is pending and the verdict waits for it
    partial = {k: v for k, v in rows.items() if "/attention/" not in k}
    text = report.render(report.build(partial, TINY, str(csv), []))
    assert "12 of 13 jobs have run" in text and "pending (0 of 1 seeds" in text
    full = report.write(csv, tmp_path / "page.md", TINY).read_text()
    assert "all 13 jobs have run" in full and "nmf_one_step − attention" in full
    assert "Measured wall time" in full


def test_verdict_interval_from_rows() -> None:
    """The verdict's interval is the paired t interval of the per-seed differences."""
    plan = Plan(seeds=(0, 1, 2), benchmarks=("mnist1d_shuffled",))
    rows = {}
    for seed, (a, b) in enumerate([(0.60, 0.50), (0.62, 0.50), (0.64, 0.50)]):
        for arm, acc in (("nmf_one_step", a), ("self_attention", b)):
            rows[f"{arm}{seed}"] = {"benchmark": "mnist1d_shuffled", "arm": arm, "seed": seed,
                                    "status": "ok", "accuracy": acc, "epochs_run": 3}  # fmt: skip
    line = report._verdict(plan, rows, "mnist1d_shuffled")
    # differences 10, 12, 14: mean 12, sd 2, half-width 4.303 * 2 / sqrt(3) = 4.97
    assert "+12.0 points" in line and "[+7.0, +17.0]" in line and "above" in line


def test_deq_row_reports_the_spectral_radius(tmp_path: Path) -> None:
    """A DEQ job's row: forward steps, and ρ(J) at the end equal to the largest |eigenvalue|
    of the cell's dense Jacobian at the point the probe's tight solve reaches (over the probe
    sequences). That point is taken with the probe's own solve: a trained cell with ρ > 1 (as
    on some processors) has no attracting fixed point, and J then depends on where the
    iteration stops."""
    plan = Plan(seeds=(0,), mnist_epochs=1, benchmarks=("mnist1d",),
                overrides=("data.num_samples=100", "model.width=8"))  # fmt: skip
    job = next(j for j in jobs(plan) if j.arm == "deq_one_step_spectral")
    row = job_row(job, tmp_path)
    assert row["forward_steps"] is not None and 1 <= row["forward_steps"] <= 20
    cfg = compose_overrides([*job.overrides, *JOB_SETTINGS])
    rho = deq_spectral_radius(cfg, tmp_path / job.key, probe=2)
    _, test, info = build_datasets(cfg.data)
    model = build_model(info, ih.make_context("none", 8), cfg.model)
    model.load_state_dict(read_checkpoint(tmp_path / job.key / "checkpoint.pt")["model"])
    model.eval()
    x = torch.stack([test[i][0] for i in range(2)])
    tight = ih.FixedPointIteration(max_steps=100, tol=1e-6)  # the probe's solve
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # as in the probe: a non-converged solve warns
        inj = model.inject(model.stem(x))
        z = ih.fixed_point(model.cell, torch.zeros_like(inj), inj, solver=tight).value
    with torch.enable_grad():
        jac = torch.autograd.functional.jacobian(lambda v: model.cell(v, inj), z)
    n = z.numel()
    dense = float(torch.linalg.eigvals(jac.reshape(n, n).double()).abs().max())
    assert abs(rho - dense) <= 0.05 * dense
    assert abs(row["spectral_radius"] - rho) <= 0.5  # 64 probe sequences vs 2: same scale


def test_report_renders_from_a_fixture_csv(tmp_path: Path) -> None:
    """A small committed-style CSV (rows written by the study's own writer, one session in the
    sidecar) renders: per-seed values, mean ± sd, the published row beside ours, the check
    against it, the paired interval, the learning-curve status, the tiers and the wall time."""
    plan = Plan(benchmarks=("h3_induction",), tiers=(1, 2), arm_seconds=300.0)  # nmf cap 16
    accuracy = {"attention": (1.0, 1.0, 0.98), "nmf_one_step": (0.30, 0.40, 0.35)}
    rows = {}
    for job in jobs(plan):
        if job.arm not in accuracy:
            continue  # vq / cd one-step: pending
        acc = accuracy[job.arm][job.seed]
        curve = [(e, acc * e / 4) for e in range(1, 5)]  # still rising at its last epoch
        rows[job.key] = {"job": job.key, "study": "sequence_benchmarks", "stage": job.stage,
                         "benchmark": job.benchmark, "arm": job.arm, "seed": job.seed,
                         "epochs": job.epochs, "plan": plan.digest(), "status": "ok",
                         "accuracy": acc, "epochs_run": 4, "train_s": 60.0, "s_per_epoch": 15.0,
                         "curve": encode_curve(curve), "cpu": "test cpu", "threads": 1,
                         "commit": "abc"}  # fmt: skip
    csv = tmp_path / "runs.csv"
    write_rows(csv, rows, COLUMNS)
    append_session(csv, {"started": 0.0, "finished": 5400.0, "jobs_run": 6, "workers": 2,
                         "plan": plan.digest(), "main_epochs": None})  # fmt: skip
    text = report.write(csv, tmp_path / "page.md", plan).read_text()
    assert "6 of 15 jobs have run" in text
    assert "| attention | 400 | 99.3 ± 1.2 | 100.0 | 100.0, 100.0, 98.0 | 4, 4, 4 |" in text
    assert "attention: 99.3 ± 1.2 % against the published 100 %: -0.7 points, within 1" in text
    missed = report._checks(Plan(benchmarks=("mnist1d",)), {
        f"cnn{seed}": {"benchmark": "mnist1d", "arm": "cnn", "seed": seed, "status": "ok",
                       "accuracy": 0.979, "epochs_run": 150}
        for seed in (0, 1, 2)
    })  # fmt: skip
    assert (
        "cnn: 97.9 ± 0.0 % against the published 94 %: +3.9 points, NOT within 3 (our" in missed[1]
    )
    diffs = [100 * (b - a) for a, b in zip(*accuracy.values(), strict=True)]
    half = 4.303 * statistics.stdev(diffs) / math.sqrt(3)
    mean = statistics.fmean(diffs)
    assert f"{mean:+.1f} points, 95 % t interval [{mean - half:+.1f}, {mean + half:+.1f}]" in text
    assert "below the reference" in text
    # nmf seed 0: best of the last 2 epochs 0.3 against 0.15 before: +15 points
    assert (
        "| nmf_one_step | 1: 9, 4: 35, 8: 35, 12: 35, 16: 35 | s0 rising (+15.0 in the last 2"
        in text
    )
    assert "s0 solved at epoch 4; s1 solved at epoch 4; s2 rising" in text
    assert ("Measured wall time** of the runner's invocations recorded in the sessions "
            "sidecar: 90 minutes, in which they ran 6 jobs") in text  # fmt: skip
    assert "not the wall time of the whole run" not in text  # it recorded all 6 finished jobs
    assert "6 minutes of training summed over the finished jobs" in text
    recorded = [{"started": 0.0, "finished": 600.0, "jobs_run": 2, "plan": plan.digest()}]
    text = report.render(report.build(rows, plan, str(csv), recorded))
    assert "ran 2 jobs (failed and preempted ones included); the other finished jobs" in text
    assert "so this is not the wall time of the whole run" in text
    assert "| 2 | Hamburger mixers under OneStep" in text and "| 3 of 12 |" in text
    assert "nmf_one_step − attention_bidirectional, paired by seed have run" in text  # pending
    assert "The plan fits the issue's budget of 120 minutes" in text  # tiers 1-2 only
    causal = [r for r in ATTENTION_RUNS if r.mixer.startswith("causal") and r.solved_at]
    assert {r.benchmark: r.solved_at for r in causal} == ATTENTION_SOLVED_AT
    for r in ATTENTION_RUNS:  # the measured attention jobs, as the plan records them
        row = f"| {report.TITLES[r.benchmark]} | {r.mixer} | {r.epochs} | {100 * r.best:.1f} |"
        assert row in text


def test_deq_jobs_without_an_attracting_fixed_point_are_named() -> None:
    def deq(arm: str, steps: float, rho: float, failures: str = "800") -> dict[str, object]:
        return {"benchmark": "mnist1d", "arm": arm, "status": "ok", "forward_steps": steps,
                "spectral_radius": rho, "failures": failures}  # fmt: skip

    mlp = {"benchmark": "mnist1d", "arm": "mlp", "status": "ok", "spectral_radius": ""}
    rows = {"a": deq("deq_unroll_none", 20.0, 1.18), "c": deq("deq_implicit_none", 7.5, 0.62),
            "b": deq("deq_neumann_none", 20.0, 1.81, "1600"), "d": mlp}  # fmt: skip
    note = report.fixed_point_note(rows, "mnist1d")
    assert note.startswith("Fixed points: in 2 of 3 DEQ jobs the forward solve used all 20")
    assert "(1.18 to 1.81)" in note and "counted 800 to 1600 failures per job" in note
    assert report.fixed_point_note({"c": rows["c"]}, "mnist1d").startswith(
        "Fixed points: every one of the 1 DEQ jobs"
    )
    assert report.fixed_point_note(rows, "h3_induction") == ""  # no DEQ rows there


def test_measured_job_minutes_take_each_arms_fastest_epoch() -> None:
    def row(job: str, arm: str, s_per_epoch: float, epochs: int, status: str = "ok") -> dict:
        return {"job": job, "benchmark": "h3_induction", "arm": arm, "status": status,
                "s_per_epoch": s_per_epoch, "epochs_run": epochs}  # fmt: skip

    rows = {"a0": row("a0", "nmf", 6.0, 10), "a1": row("a1", "nmf", 3.0, 20),
            "b0": row("b0", "none", 1.5, 40), "x": row("x", "nmf", 0.1, 10, "failed")}  # fmt: skip
    assert report.fastest_minutes(rows) == {"a0": 0.5, "a1": 1.0, "b0": 1.0}  # failed: ignored
