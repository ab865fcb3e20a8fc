"""What the study v3 plan cost: every invocation of its runner (the sessions sidecar), job
minutes per stage, the peak memory of a job, and the wall time of a run from scratch (the
budget the issue states). Read from the CSV rows and the sessions sidecar only."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from experiments.reports.render import Table
from experiments.studies.paper_v3.plan import Job, Plan

STAGES = ("pretrain", "tune", "main", "k_axis", "length")


@dataclass(frozen=True)
class Budget:
    """The plan's cost, as ``PaperV3`` reports it."""

    wall_minutes: float | None  # every invocation with this plan, summed
    sessions: int
    session_table: Table  # every invocation of the runner with this plan
    stage_table: Table  # the plan's own jobs: job minutes per stage
    job_minutes: float
    peak_mem_mb: float | None
    plan_job_minutes: float
    from_scratch_minutes: float | None


def plan_budget(
    plan: Plan,
    rows: Mapping[str, Mapping[str, Any]],
    sessions: Sequence[Mapping[str, Any]],
    known: Sequence[Job],
    expected: Collection[str],
    ok: int,
) -> Budget:
    """The cost of ``plan`` from its CSV rows (job key -> row), the sessions sidecar, the
    plan's jobs (``known``, their keys ``expected``) and how many of them ended ok."""
    own = [r for r in rows.values() if r.get("plan") == plan.digest()]
    peaks = [float(r["peak_mem_mb"]) for r in own if r.get("peak_mem_mb") is not None]
    mine = [s for s in sessions if s.get("plan") == plan.digest()]
    session_table = Table.of(
        ["invocation", "main arms' epochs", "jobs run", "workers", "wall min"],
        [(i + 1, s.get("main_epochs") or "–", s["jobs_run"], s["workers"],
          f"{(s['finished'] - s['started']) / 60:.1f}") for i, s in enumerate(mine)],
    )  # fmt: skip
    stage_rows = []
    for stage in STAGES:
        done = [rows[j.key] for j in known if j.stage == stage and ok_row(rows.get(j.key))]
        stage_rows.append((stage, len(done), f"{job_seconds(done) / 60:.1f}"))
    return Budget(
        wall_minutes=sum(s["finished"] - s["started"] for s in mine) / 60 if mine else None,
        sessions=len(mine),
        session_table=session_table,
        stage_table=Table.of(["stage", "jobs (ok)", "job min"], stage_rows),
        job_minutes=job_seconds(own) / 60,
        peak_mem_mb=max(peaks) if peaks else None,
        plan_job_minutes=job_seconds([rows[k] for k in expected if k in rows]) / 60,
        from_scratch_minutes=_from_scratch(mine, len(expected), ok),
    )


def ok_row(row: Mapping[str, Any] | None) -> bool:
    """Whether a job's row exists and ended ok."""
    return row is not None and row.get("status") == "ok"


def job_seconds(rows: Sequence[Mapping[str, Any]]) -> float:
    """Seconds from start to end, summed over the rows that record both."""
    return sum(float(r["finished"]) - float(r["started"]) for r in rows
               if r.get("started") is not None and r.get("finished") is not None)  # fmt: skip


def _from_scratch(sessions: Sequence[Mapping[str, Any]], expected: int, ok: int) -> float | None:
    """The wall minutes of a run from scratch: one invocation that ran every job of the plan
    (and they all ended ok); None when the CSV was written otherwise."""
    if len(sessions) != 1 or ok != expected or sessions[0]["jobs_run"] < expected:
        return None
    return (sessions[0]["finished"] - sessions[0]["started"]) / 60
