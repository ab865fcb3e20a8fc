"""Run (or resume) study v4: every job of ``paper_v4.plan`` without an ``ok`` row in the CSV,
two at a time, each row (with its processor, thread count and library commit) written to the
committed CSV as its job ends.

Jobs are composed from ``conf/config.yaml`` + ``+experiment=paper_v4`` + ``+arm=<arm>`` + the
job's overrides and trained by the engine (``paper_v3.train_row``: test metrics on the
replicate's held-out canvases, val curve); the scheduling, the backbones and the row writing
are study v3's (``job_runner``, ``paper_v3``, ``paper_v3_table``). Interrupt it at any time and
run the same command again: finished jobs are skipped.

    OMP_NUM_THREADS=1 python -m experiments.studies.paper_v4.run multirun/study/paper_v4 \\
        --csv docs/results/paper_v4.csv --workers 2
    python -m experiments.studies.paper_v4.report --csv docs/results/paper_v4.csv --out docs
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from experiments.config.groups import TrainConfig
from experiments.studies.csv_rows import COLUMNS as V3_COLUMNS
from experiments.studies.paper_v3 import run as paper_v3
from experiments.studies.paper_v3.plan import REGIME, Job
from experiments.studies.paper_v3.run import measured_row, pending, pretrain_row, train_row
from experiments.studies.paper_v4.plan import STUDY, Plan, all_jobs, arm_name, start_order, tuned
from experiments.studies.provenance import provenance

logger = logging.getLogger(__name__)

COLUMNS = (*V3_COLUMNS, "cpu", "threads", "commit", "torch")
DEFAULT_OUT = Path("multirun/study/paper_v4")
DEFAULT_CSV = Path("docs/results/paper_v4.csv")


def job_overrides(job: Job, plan: Plan, out_dir: Path) -> list[str]:
    """The Hydra overrides that make ``job`` out of the paper_v4 preset and its arm."""
    return [
        *paper_v3.job_overrides(job, plan, out_dir, preset="paper_v4", arm=arm_name(job)),
        f"data.test_size={plan.test_size}",
        f"clip_grad_norm={plan.clip_grad_norm}",
        *plan.overrides,
    ]


def compose_job(job: Job, plan: Plan, out_dir: Path) -> TrainConfig:
    """The typed config of a training job."""
    return paper_v3.compose_overrides(job_overrides(job, plan, out_dir))


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
        return train_row(cfg, out_dir / "jobs" / job.key, fidelity=None)

    row = measured_row(base_row(job, plan), job.key, work)
    row["threads"] = provenance()["threads"]  # as the job ran (measured_row sets one thread)
    return row


def pending_jobs(plan: Plan, rows: dict[str, dict[str, Any]], out_dir: Path) -> list[Job]:
    """The jobs still to run in the runner's order, with the pretraining their replicates need
    (every replicate's while tuning is unsettled: the main arms are not known yet)."""
    needed = set() if tuned(plan, rows) else set(plan.all_replicates())
    return sorted(
        pending(all_jobs(plan, rows), rows, out_dir, needed), key=lambda j: start_order(plan, j)
    )


def run_study(plan: Plan, out_dir: Path, csv_path: Path, workers: int = 2) -> dict[str, int]:
    """Run every job not yet ``ok`` in ``csv_path``, ``workers`` at a time (1: in this
    process). Returns counts: ran, failed, skipped."""
    return paper_v3.run_csv_study(plan, out_dir, csv_path, workers, pending=pending_jobs,
                                  run=run_job, order=lambda j: start_order(plan, j),
                                  columns=COLUMNS)  # fmt: skip


def main(argv: Sequence[str] | None = None) -> None:
    """Run (or resume) the study into OUT_DIR, its rows into --csv."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", nargs="?", default=str(DEFAULT_OUT))
    parser.add_argument("--csv", default=str(DEFAULT_CSV), help="the study's CSV (resumed)")
    parser.add_argument("--workers", type=int, default=2, help="jobs run at once")
    parser.add_argument("--list", action="store_true", help="print the pending jobs and stop")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    paper_v3.run_command(Plan(), args, pending_jobs, run_study, COLUMNS)


if __name__ == "__main__":
    main()
