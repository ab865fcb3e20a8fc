"""Study v4's budget: costs from each arm's fastest row (and the median beside it), the
replicates a budget holds, computed by hand from a handful of rows."""

from __future__ import annotations

import statistics
from typing import Any

import pytest

from experiments.studies.job_costs import fastest
from experiments.studies.paper_v4.budget import (
    BudgetPlan,
    budget_plan,
    measured_costs,
    planned_jobs,
    study_costs,
)
from experiments.studies.paper_v4.jobs import Job
from experiments.studies.paper_v4.plan import Plan, tuned_arms

PLAN = Plan(replicates=4, tune_replicates=(50,), lrs=(0.05,), length_replicates=(0,),
            secondary_replicates=(0,), ks=(1,))  # fmt: skip


Row = dict[str, Any]


def _row(context: str, gradient: str, minutes: float, epochs: int = 10, **more: Any) -> Row:
    k = 0 if gradient == "-" else 6
    return {"stage": "main", "context": context, "gradient": gradient, "K": k, "status": "ok",
            "started": 100.0, "finished": 100.0 + 60 * minutes, "epochs": epochs,
            **more}  # fmt: skip


def test_fastest_takes_each_arms_smallest_measured_cost() -> None:
    rows: list[Row] = [{"arm": "a", "s": 3.0}, {"arm": "a", "s": 1.5}, {"arm": "b", "s": None},
                       {"arm": "b", "s": 4.0}, {"arm": "c", "s": None}]  # fmt: skip
    assert fastest(rows, lambda r: r["arm"], lambda r: r["s"]) == {"a": 1.5, "b": 4.0}


def test_costs_at_fastest_and_median_rows_per_epoch() -> None:
    rows = [_row("nmf", "bptt", 2.0), _row("nmf", "bptt", 6.0), _row("nmf", "bptt", 3.0),
            _row("nmf", "bptt", 0.5, K=1),  # K = 1: cheaper, not the K = 6 arm's cost
            _row("none", "-", 1.0, epochs=5), _row("vq", "bptt", 9.0, status="failed"),
            {"stage": "pretrain", "status": "ok", "started": 0.0, "finished": 120.0},
            {"stage": "pretrain", "status": "ok", "started": 0.0, "finished": 60.0}]  # fmt: skip
    low = measured_costs(rows, "test")
    mid = measured_costs(rows, "test", statistics.median)
    assert low is not None and mid is not None
    assert low.per_epoch == {("nmf", "bptt", 6): 0.2, ("nmf", "bptt", 1): 0.05,
                             ("none", "-", 0): 0.2, ("gap", "-", 0): 0.2}  # fmt: skip
    assert mid.per_epoch[("nmf", "bptt", 6)] == pytest.approx(0.3)
    assert (low.pretrain, mid.pretrain) == (1.0, 1.5)
    assert not low.measures("vq", "bptt")  # the failed row is not a measurement
    job = Job("main", "nmf", "bptt", 6, 1.0, 0.05, 0, 32)
    assert low.minutes(job) == pytest.approx(6.4)
    assert low.minutes(Job("main", "nmf", "bptt", 1, 1.0, 0.05, 0, 32)) == pytest.approx(1.6)
    # a K never measured takes its arm's largest; a context never measured the largest known
    assert low.minutes(Job("main", "nmf", "bptt", 12, 1.0, 0.05, 0, 32)) == pytest.approx(6.4)
    assert low.minutes(Job("main", "cd", "bptt", 6, 1.0, 0.05, 0, 32)) == pytest.approx(6.4)


def test_budget_holds_the_replicates_that_fit_beside_the_fixed_part() -> None:
    budget = BudgetPlan(150, 2, fixed_job_minutes=100.0, per_replicate_job_minutes=7.0,
                        secondary_job_minutes=20.0)  # fmt: skip
    assert budget.capacity == 300
    assert budget.replicates_held() == 28  # (300 - 100) // 7
    assert budget.wall_minutes(20, secondary=False) == pytest.approx((100 + 140) / 2)
    assert budget.wall_minutes(20, secondary=True) == pytest.approx((100 + 140 + 20) / 2)
    assert BudgetPlan(150, 2, 400.0, 7.0, 0.0).replicates_held() == 0


def test_budget_plan_sums_the_planned_jobs_at_the_costs() -> None:
    rows = {f"{c}/{g}": {**_row(c, g, 1.0), "plan": PLAN.digest()} for c, g in tuned_arms()}
    rows["p"] = {"stage": "pretrain", "status": "ok", "started": 0.0, "finished": 30.0,
                 "plan": PLAN.digest()}  # fmt: skip
    costs = study_costs(PLAN, rows, {})
    assert costs.source.startswith("this study's")
    jobs = planned_jobs(PLAN)
    epochs = {s: sum(j.epochs for j in js if j.stage != "pretrain") for s, js in jobs.items()}
    first = sum(j.epochs for j in jobs["main"] if j.replicate == 0)
    budget = budget_plan(PLAN, costs)
    # every arm at 0.1 min per epoch, a pretraining run 0.5 min
    assert budget.per_replicate_job_minutes == pytest.approx(0.5 + 0.1 * first)
    assert budget.fixed_job_minutes == pytest.approx(
        0.5 * len(PLAN.tune_replicates) + 0.1 * (epochs["tune"] + epochs["length"])
    )
    assert budget.secondary_job_minutes == pytest.approx(0.1 * epochs["secondary"])


def test_costs_fall_back_to_study_v3_until_every_tuned_arm_has_a_row() -> None:
    mine = {"a": {**_row("nmf", "bptt", 1.0), "plan": PLAN.digest()}}
    v3 = {"x": _row("nmf", "bptt", 5.0), "y": _row("none", "-", 2.0)}
    assert study_costs(PLAN, mine, v3).source.startswith("study v3")
    with pytest.raises(ValueError, match="no measured job time"):
        study_costs(PLAN, {}, {})
