"""The public-benchmark study: its plan (arms, seeds, equal budgets), a tiny resumable run
through the engine, and the page with zero and partial rows."""

from __future__ import annotations

from pathlib import Path

import torch

import implicit_ham as ih
from experiments.engine.build import build_datasets, build_model
from experiments.engine.checkpoint import read_checkpoint
from experiments.studies.paper_v3.run import compose_overrides
from experiments.studies.paper_v3.table import read_rows
from experiments.studies.sequence_benchmarks import report
from experiments.studies.sequence_benchmarks.plan import H3_TASKS, Plan, cost, jobs
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
        assert by_task[task] == {"attention", "linear_attention", "none"} | hams
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
        if job.benchmark in H3_TASKS:  # attention at the published epochs, the rest equal
            want = H3_TASKS[job.benchmark] if job.arm == "attention" else plan.h3_epochs
        else:
            want = plan.mnist_epochs
        assert job.epochs == want and f"epochs={want}" in job.overrides
    assert cost(plan)["total"] > 0


TINY = Plan(
    seeds=(0,), h3_epochs=1, attention_epochs=2, benchmarks=("h3_associative_recall",),
    overrides=("data.num_examples=24", "data.num_test_examples=8", "model.width=16"),
)  # fmt: skip


def test_tiny_run_is_resumable_and_renders(tmp_path: Path) -> None:
    csv = tmp_path / "runs.csv"
    empty = report.render(report.build({}, TINY, str(csv), []))
    assert "0 of 12 jobs have run" in empty and "pending (0 of 1 seeds" in empty
    counts = run_study(TINY, tmp_path / "out", csv, workers=1)
    assert counts == {"ran": 12, "failed": 0, "skipped": 0}
    rows = read_rows(csv, COLUMNS)
    assert all(r["status"] == "ok" and r["commit"] for r in rows.values())
    again = run_study(TINY, tmp_path / "out", csv, workers=1)
    assert again == {"ran": 0, "failed": 0, "skipped": 12}
    # partial: drop one arm's row; the page says it is pending and the verdict waits for it
    partial = {k: v for k, v in rows.items() if "/attention/" not in k}
    text = report.render(report.build(partial, TINY, str(csv), []))
    assert "11 of 12 jobs have run" in text and "pending (0 of 1 seeds" in text
    full = report.write(csv, tmp_path / "page.md", TINY).read_text()
    assert "all 12 jobs have run" in full and "nmf_one_step − attention" in full
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
    of the cell's dense Jacobian at the fixed point (over the probe sequences)."""
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
    dense = []
    with torch.no_grad():
        for i in range(2):
            inj = model.inject(model.stem(test[i][0][None]))
            z = ih.fixed_point(
                model.cell,
                torch.zeros_like(inj),
                inj,
                solver=ih.FixedPointIteration(max_steps=200, tol=1e-8),
            ).value
            with torch.enable_grad():
                jac = torch.autograd.functional.jacobian(lambda v, x=inj: model.cell(v, x), z)
            n = z.numel()
            dense.append(float(torch.linalg.eigvals(jac.reshape(n, n).double()).abs().max()))
    assert abs(rho - max(dense)) <= 0.05 * max(dense)
    assert abs(row["spectral_radius"] - rho) <= 0.5  # 64 probe sequences vs 2: same scale
