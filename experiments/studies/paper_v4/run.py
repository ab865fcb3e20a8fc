"""Run (or resume) study v4: every job of ``paper_v4.plan`` without an ``ok`` row in the CSV,
two at a time, each row (with its processor, thread count and library commit) written to the
committed CSV as its job ends.

Jobs are composed from ``conf/config.yaml`` + ``+experiment=paper_v4`` + ``+arm=<arm>`` + the
job's overrides and trained by the engine (``paper_v4.training.train_row``: test metrics on
the replicate's held-out canvases, val curve); ``job_runner`` schedules them, ``job_row``
measures each and ``csv_rows`` writes its row. A job whose row says ``ok`` (with this plan) is
skipped without touching ``OUT``, so the study resumes from the committed CSV alone on a fresh
machine; a replicate's backbone (``OUT/pretrain/replicate<r>.pt``) is rebuilt,
deterministically, only when a job that still has to run needs it. Interrupt it at any time and
run the same command again: finished jobs are skipped.

    OMP_NUM_THREADS=1 python -m experiments.studies.paper_v4.run multirun/study/paper_v4 \\
        --csv docs/results/paper_v4.csv --workers 2
    python -m experiments.studies.paper_v4.report --csv docs/results/paper_v4.csv --out docs
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from experiments.config.groups import TrainConfig
from experiments.engine.provenance import provenance
from experiments.studies.csv_rows import COLUMNS as ROW_COLUMNS
from experiments.studies.csv_rows import read_plan_rows, read_rows, session_recorder, write_rows
from experiments.studies.job_row import compose_overrides, measured_row
from experiments.studies.job_runner import Schedule, run_schedule
from experiments.studies.paper_v4.jobs import REGIME, Job
from experiments.studies.paper_v4.plan import STUDY, Plan, all_jobs, arm_name, start_order, tuned
from experiments.studies.paper_v4.training import backbone_path, pretrain_row, train_row

logger = logging.getLogger(__name__)

COLUMNS = (*ROW_COLUMNS, "cpu", "threads", "commit", "torch")
DEFAULT_OUT = Path("multirun/study/paper_v4")
DEFAULT_CSV = Path("docs/results/paper_v4.csv")
Rows = dict[str, dict[str, Any]]


def job_overrides(job: Job, plan: Plan, out_dir: Path) -> list[str]:
    """The Hydra overrides that make ``job`` out of the paper_v4 preset and its arm: the
    replicate's seeds and backbone, the rate, the epochs, K and inv_t (a ham's), the test-set
    size, the clip, then the plan's own ``overrides``."""
    data_seed = plan.data_seed(job.replicate)
    overrides = [
        "+experiment=paper_v4",
        f"+arm={arm_name(job)}",
        f"seed={job.replicate}",
        f"data.seed={data_seed}",
        f"data.scan_seed={data_seed}",
        f"model.pretrained={backbone_path(out_dir, job.replicate)}",
        f"optim.lr={job.lr}",
        f"epochs={job.epochs}",
    ]
    if job.context not in ("none", "sdpa", "gap"):
        overrides += [f"context.steps={job.K}", f"context.eval_steps={job.K}"]
    if job.inv_t is not None:
        overrides.append(f"context.inv_t={job.inv_t}")
    return [
        *overrides,
        f"data.test_size={plan.test_size}",
        f"clip_grad_norm={plan.clip_grad_norm}",
        *plan.overrides,
    ]


def compose_job(job: Job, plan: Plan, out_dir: Path) -> TrainConfig:
    """The typed config of a training job."""
    return compose_overrides(job_overrides(job, plan, out_dir))


def base_row(job: Job, plan: Plan) -> dict[str, Any]:
    """The row's identity and provenance (before the job runs)."""
    return {
        "job": job.key, "study": STUDY, "stage": job.stage, "regime": REGIME,
        "context": job.context, "gradient": job.gradient, "K": job.K, "inv_t": job.inv_t,
        "lr": job.lr, "replicate": job.replicate, "data_seed": plan.data_seed(job.replicate),
        "model_seed": job.replicate, "epochs": job.epochs, "plan": plan.digest(),
        **provenance(),
    }  # fmt: skip


def run_job(job: Job, plan: Plan, out_dir: Path) -> dict[str, Any]:
    """Run one job (in a worker process, one thread) and return its CSV row."""

    def work() -> dict[str, Any]:
        if job.stage == "pretrain":
            return pretrain_row(job, plan, out_dir)
        cfg = compose_job(job, plan, out_dir)
        return train_row(cfg, out_dir / "jobs" / job.key)

    return measured_row(base_row(job, plan), job.key, work)


def pending(jobs: Sequence[Job], rows: Rows, out_dir: Path, needed: set[int]) -> list[Job]:
    """Of ``jobs``: the training jobs without an ``ok`` row, and the pretraining of each
    replicate that one of them (or ``needed``) trains on whose backbone is missing."""
    todo = [j for j in jobs if j.stage != "pretrain" and rows.get(j.key, {}).get("status") != "ok"]
    needed = needed | {j.replicate for j in todo}

    def missing(job: Job) -> bool:
        ok = rows.get(job.key, {}).get("status") == "ok"
        return not ok or not backbone_path(out_dir, job.replicate).exists()

    pretrain = [j for j in jobs if j.stage == "pretrain" and j.replicate in needed and missing(j)]
    return pretrain + todo


def pending_jobs(plan: Plan, rows: Rows, out_dir: Path) -> list[Job]:
    """The jobs still to run in the runner's order, with the pretraining their replicates need
    (every replicate's while tuning is unsettled: the main arms are not known yet)."""
    needed = set() if tuned(plan, rows) else set(plan.all_replicates())
    return sorted(
        pending(all_jobs(plan, rows), rows, out_dir, needed), key=lambda j: start_order(plan, j)
    )


def ready(job: Job, out_dir: Path, settled: Mapping[str, Mapping[str, Any]]) -> bool:
    """A training job can start once its replicate's backbone exists (or its pretraining ended
    ok in this invocation: ``settled``, the rows of the jobs that ended)."""
    if job.stage == "pretrain":
        return True
    pretrained = {r["replicate"] for r in settled.values()
                  if r["stage"] == "pretrain" and r["status"] == "ok"}  # fmt: skip
    return job.replicate in pretrained or backbone_path(out_dir, job.replicate).exists()


def run_study(plan: Plan, out_dir: Path, csv_path: Path, workers: int = 2) -> dict[str, int]:
    """Run every job not yet ``ok`` in ``csv_path``, ``workers`` at a time (1: in this
    process; ``job_runner.run_schedule``), started in ``start_order`` once their backbone
    exists, each row written as its job ends and the invocation appended to the sessions
    sidecar. Returns counts: ran, failed, skipped."""
    out_dir, csv_path = Path(out_dir).resolve(), Path(csv_path)
    rows = read_plan_rows(csv_path, COLUMNS, plan.digest())
    schedule = Schedule(
        pending=lambda current: pending_jobs(plan, dict(current), out_dir),
        ready=lambda job, settled: ready(job, out_dir, settled),
        order=lambda job: start_order(plan, job),
        run=run_job,
        args=(plan, out_dir),
        write=lambda current, _: write_rows(csv_path, current, COLUMNS),
        session=session_recorder(csv_path, workers, plan.digest(), plan.main_epochs),
    )
    return run_schedule(schedule, rows, workers)


def main(argv: Sequence[str] | None = None) -> None:
    """Run (or resume) the study into OUT_DIR, its rows into --csv (``--list``: log the
    pending jobs and stop)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", nargs="?", default=str(DEFAULT_OUT))
    parser.add_argument("--csv", default=str(DEFAULT_CSV), help="the study's CSV (resumed)")
    parser.add_argument("--workers", type=int, default=2, help="jobs run at once")
    parser.add_argument("--list", action="store_true", help="print the pending jobs and stop")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    plan = Plan()
    if args.list:
        rows = read_rows(args.csv, COLUMNS)
        for job in pending_jobs(plan, rows, Path(args.out_dir).resolve()):
            logger.info("%s %s", job.stage, job.key)
        return
    counts = run_study(plan, Path(args.out_dir), Path(args.csv), args.workers)
    logger.info("ran %(ran)d jobs (%(failed)d failed); %(skipped)d already ok", counts)
    if counts["failed"]:
        logger.warning("some jobs failed; run the same command again to retry them")


if __name__ == "__main__":
    main()
