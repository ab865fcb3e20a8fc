"""Study v4's budget: the minutes each stage costs and how many test replicates the wall-clock
budget of ``make study`` holds.

A job's minutes scale with its epochs. The minutes per epoch of each (context, gradient, K)
come from measured rows (an epoch at K = 1 costs less than one at K = 12): study v4's own once
every tuned arm has one, else the idle-host rows of study v3's CSV (same network, same data,
same epochs). This host is shared, so a row's time depends on the load it met; the projection
for idle cores takes each arm's **fastest** row (still an overstatement where every row of an
arm ran under load), and the page also gives the projection at each arm's median row, the
loads the rows actually met.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from experiments.reports.render import Table
from experiments.studies.paper_v4.jobs import Job
from experiments.studies.paper_v4.plan import STAGES, Plan, jobs_of_stage, tune_jobs, tuned_arms

BUDGET_MIN = 150  # `make study` on 2 idle cores (issue 49)
WORKERS = 2
Rows = Mapping[str, Mapping[str, Any]]
Statistic = Callable[[Sequence[float]], float]
ALIASES = {"gap": "none"}  # a context costed as another (study v3 has no GAP arm)


def job_minutes(row: Mapping[str, Any]) -> float | None:
    """A row's wall minutes per epoch (start to end), None without both stamps or epochs."""
    if row.get("status") != "ok" or row.get("started") is None or row.get("finished") is None:
        return None
    epochs = row.get("epochs") or 0
    if epochs <= 0:
        return None
    return (float(row["finished"]) - float(row["started"])) / 60 / epochs


@dataclass(frozen=True)
class Costs:
    """Minutes per epoch of a job of each (context, gradient, K) and of a pretraining run, and
    where they were measured."""

    per_epoch: Mapping[tuple[str, str, int], float]
    pretrain: float
    source: str

    def minutes(self, job: Job) -> float:
        """The job's expected minutes: its (context, gradient, K)'s cost per epoch; without a
        measurement at its K, the largest of its (context, gradient) at any K; without one of
        those, the largest known."""
        if job.stage == "pretrain":
            return self.pretrain
        arm = (job.context, job.gradient)
        same_arm = [v for (c, g, _), v in self.per_epoch.items() if (c, g) == arm]
        fallback = max(same_arm or list(self.per_epoch.values()) or [0.0])
        return self.per_epoch.get((job.context, job.gradient, job.K), fallback) * job.epochs

    def measures(self, context: str, gradient: str) -> bool:
        """Whether some row measured the arm (at any K)."""
        return any((c, g) == (context, gradient) for c, g, _ in self.per_epoch)


def measured_costs(rows: Sequence[Mapping[str, Any]], source: str,
                   statistic: Statistic = min) -> Costs | None:  # fmt: skip
    """``statistic`` (``min``: each arm's fastest row; ``statistics.median``) of the minutes
    per epoch per (context, gradient, K) and of the pretraining minutes over ``rows``; a
    context of ``ALIASES`` without rows takes the other's cost. None without a training row."""
    per_arm: dict[tuple[str, str, int], list[float]] = {}
    pretrain = []
    for row in rows:
        if row.get("stage") == "pretrain":
            if row.get("status") == "ok" and row.get("started") is not None:
                pretrain.append((float(row["finished"]) - float(row["started"])) / 60)
            continue
        minutes = job_minutes(row)
        if minutes is not None:
            arm = (str(row["context"]), str(row["gradient"]), int(float(row.get("K") or 0)))
            per_arm.setdefault(arm, []).append(minutes)
    if not per_arm:
        return None
    per_epoch = {arm: statistic(v) for arm, v in per_arm.items()}
    for mine, theirs in ALIASES.items():
        for (context, gradient, k), value in list(per_epoch.items()):
            if context == theirs and (mine, gradient, k) not in per_epoch:
                per_epoch[(mine, gradient, k)] = value
    return Costs(per_epoch, statistic(pretrain) if pretrain else 0.0, source)


def study_costs(plan: Plan, rows: Rows, v3_rows: Rows, statistic: Statistic = min) -> Costs:
    """The costs from this study's rows of ``plan`` once every tuned arm has one, else from
    study v3's rows. Raises ValueError when neither has a training row."""
    own = [r for r in rows.values() if r.get("plan") == plan.digest()]
    mine = measured_costs(own, f"this study's {len(own)} rows", statistic)
    if mine is not None and all(mine.measures(c, g) for c, g in tuned_arms()):
        return mine
    theirs = measured_costs(
        list(v3_rows.values()),
        "study v3's rows (idle host, same network, same data and epochs; GAP costed as no context)",
        statistic,
    )
    if theirs is None:
        raise ValueError("paper_v4: no measured job time (neither this CSV nor study v3's)")
    return theirs


@dataclass(frozen=True)
class BudgetPlan:
    """How many test replicates a budget holds: the fixed part (tuning, its pretraining, the
    length check), the cost of one more test replicate, and the secondary arms."""

    budget_minutes: float
    workers: int
    fixed_job_minutes: float
    per_replicate_job_minutes: float
    secondary_job_minutes: float

    @property
    def capacity(self) -> float:
        """Job minutes the budget holds (wall minutes x workers)."""
        return self.budget_minutes * self.workers

    def replicates_held(self, most: int = 1000) -> int:
        """Test replicates whose primary jobs fit beside the fixed part (at most ``most``)."""
        room = self.capacity - self.fixed_job_minutes
        if self.per_replicate_job_minutes <= 0:
            return most if room >= 0 else 0
        return min(max(int(room // self.per_replicate_job_minutes), 0), most)

    def wall_minutes(self, replicates: int, secondary: bool) -> float:
        """Wall minutes of the primary design on ``replicates`` (and the secondary arms)."""
        total = self.fixed_job_minutes + replicates * self.per_replicate_job_minutes
        return (total + (self.secondary_job_minutes if secondary else 0.0)) / self.workers


def planned_jobs(plan: Plan) -> dict[str, list[Job]]:
    """Every stage's jobs, the later stages as if tuning had settled (their epochs do not
    depend on the rates it selects)."""
    settled = {j.key: {"status": "ok", "val_miou": 0.0} for j in tune_jobs(plan)}
    return {s: jobs_of_stage(plan, settled, s) for s in STAGES}


def stage_minutes(plan: Plan, costs: Costs) -> dict[str, tuple[int, float]]:
    """Per stage of ``STAGES``: its planned jobs and their expected job minutes."""
    return {s: (len(jobs), sum(map(costs.minutes, jobs))) for s, jobs in planned_jobs(plan).items()}


def budget_plan(plan: Plan, costs: Costs) -> BudgetPlan:
    """The budget of ``make study`` (``BUDGET_MIN`` wall minutes, ``WORKERS``) at ``costs``."""
    first = [j for j in planned_jobs(plan)["main"] if j.replicate == 0]
    minutes = stage_minutes(plan, costs)
    fixed = costs.pretrain * len(plan.tune_replicates) + minutes["tune"][1] + minutes["length"][1]
    per_replicate = costs.pretrain + sum(costs.minutes(j) for j in first)
    return BudgetPlan(BUDGET_MIN, WORKERS, fixed, per_replicate, minutes["secondary"][1])


def stage_table(plan: Plan, fastest: Costs, median: Costs) -> Table:
    """Per stage: jobs, and job and wall minutes at each arm's fastest and median row."""
    at_fastest, at_median = stage_minutes(plan, fastest), stage_minutes(plan, median)
    return Table.of(
        ["stage", "jobs", "job minutes (fastest rows)", f"wall minutes at {WORKERS} workers",
         "job minutes (median rows)"],
        [(s, n, f"{m:.0f}", f"{m / WORKERS:.0f}", f"{at_median[s][1]:.0f}")
         for s, (n, m) in at_fastest.items()],
    )  # fmt: skip
