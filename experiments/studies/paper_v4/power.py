"""Study v4's plan-and-budget arithmetic: the power of a paired non-inferiority test, the
replicates a wall-clock budget holds, and the minutes each stage costs.

Power: a primary comparison is decided non-inferior when the lower end of the 95 % t-interval
of the paired mean difference is above -δ, i.e. the two-sided p-value of ``mean = -δ`` is below
0.05 after Holm over the 3 primary comparisons. Its first (strictest) step needs p < 0.05 / 3,
so ``power`` at ``alpha = 0.05 / 3`` is a lower bound on the power of each comparison when the
true difference is 0 and the paired SD is ``sd``: ``P(T > t_{1 - alpha/2, n-1})`` with T
non-central t, n - 1 degrees of freedom and non-centrality ``δ sqrt(n) / sd``.

Cost: a job's minutes scale with its epochs; the minutes of a main-length job per arm come from
measured rows (study v4's own once they exist, else the idle-host rows of study v3's CSV, whose
jobs train the same network on the same data for the same epochs).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from scipy import stats

from experiments.studies.paper_v4.jobs import Job

FAMILY = 3  # the primary comparisons (Holm)
LEVEL = 0.05
TARGET_POWER = 0.8


def power(n: int, sd: float, margin: float, alpha: float = LEVEL / FAMILY) -> float:
    """P(the paired t-test rejects ``mean <= -margin`` at two-sided level ``alpha``) for n
    replicates, paired SD ``sd`` and a true mean difference of 0."""
    if n < 2 or not sd > 0:
        raise ValueError(f"power: need n >= 2 and sd > 0, got n={n}, sd={sd}")
    critical = stats.t.ppf(1 - alpha / 2, n - 1)
    return float(stats.nct.sf(critical, n - 1, margin * math.sqrt(n) / sd))


def replicates_for(sd: float, margin: float, target: float = TARGET_POWER,
                   alpha: float = LEVEL / FAMILY, most: int = 1000) -> int | None:  # fmt: skip
    """The fewest replicates (>= 2) whose ``power`` reaches ``target``; None beyond ``most``."""
    for n in range(2, most + 1):
        if power(n, sd, margin, alpha) >= target:
            return n
    return None


def paired_sd(differences: Sequence[float]) -> float | None:
    """The sample SD of paired differences (None below 2)."""
    return statistics.stdev(differences) if len(differences) >= 2 else None


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
    """Minutes per epoch of a job of each (context, gradient) and of a pretraining run, and
    where they were measured."""

    per_epoch: Mapping[tuple[str, str], float]
    pretrain: float
    source: str

    def minutes(self, job: Job) -> float:
        """The job's expected minutes (a context without a measurement: the largest known)."""
        if job.stage == "pretrain":
            return self.pretrain
        fallback = max(self.per_epoch.values(), default=0.0)
        return self.per_epoch.get((job.context, job.gradient), fallback) * job.epochs


def measured_costs(rows: Sequence[Mapping[str, Any]], source: str,
                   aliases: Mapping[str, str] | None = None) -> Costs | None:  # fmt: skip
    """Median minutes per epoch per (context, gradient) and of pretraining from ``rows``; a
    context of ``aliases`` (v4 name -> measured name) takes the other's cost. None without
    a training row."""
    per_arm: dict[tuple[str, str], list[float]] = {}
    pretrain = []
    for row in rows:
        if row.get("stage") == "pretrain":
            if row.get("status") == "ok" and row.get("started") is not None:
                pretrain.append((float(row["finished"]) - float(row["started"])) / 60)
            continue
        minutes = job_minutes(row)
        if minutes is not None:
            per_arm.setdefault((str(row["context"]), str(row["gradient"])), []).append(minutes)
    if not per_arm:
        return None
    per_epoch = {arm: statistics.median(v) for arm, v in per_arm.items()}
    for mine, theirs in (aliases or {}).items():
        for (context, gradient), value in list(per_epoch.items()):
            if context == theirs and (mine, gradient) not in per_epoch:
                per_epoch[(mine, gradient)] = value
    return Costs(per_epoch, statistics.median(pretrain) if pretrain else 0.0, source)


@dataclass(frozen=True)
class BudgetPlan:
    """How many test replicates a budget holds: the fixed part (tuning, its pretraining, the
    length check), the cost of one more test replicate, and the secondary arms."""

    budget_minutes: float
    workers: int
    fixed_job_minutes: float
    per_replicate_job_minutes: float
    secondary_job_minutes: float
    planned_replicates: int

    @property
    def capacity(self) -> float:
        """Job minutes the budget holds (wall minutes x workers)."""
        return self.budget_minutes * self.workers

    def replicates_held(self) -> int:
        """Test replicates whose primary jobs fit beside the fixed part."""
        room = self.capacity - self.fixed_job_minutes
        return max(int(room // self.per_replicate_job_minutes), 0)

    def wall_minutes(self, replicates: int, secondary: bool) -> float:
        """Wall minutes of the primary design on ``replicates`` (and the secondary arms)."""
        total = self.fixed_job_minutes + replicates * self.per_replicate_job_minutes
        return (total + (self.secondary_job_minutes if secondary else 0.0)) / self.workers
