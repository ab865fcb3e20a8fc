"""Re-run finished study-v4 jobs in a fresh folder (this machine, one thread) and record each
row in the re-runs sidecar ``<csv stem>.reruns.csv``; the study's own row stays as it is.

The page's reproducibility section (``paper_v4.report``) compares each re-run with the study's
row of the same job: on another processor model it is the drift across machines, on the same
processor and thread count the metrics should be identical bit for bit. Each re-run job's
replicate is pretrained again in the fresh folder first (that row is recorded too), so a job
re-run on another machine carries the drift of its whole pipeline. The jobs are run by
``paper_v4.run.run_job``, exactly as the study runs them.

    OMP_NUM_THREADS=1 python -m experiments.studies.paper_v4.rerun \\
        --csv docs/results/paper_v4.csv gap---K0-t--lr0.2-r100-e32 [JOB ...]
    python -m experiments.studies.paper_v4.report --csv docs/results/paper_v4.csv --out docs
"""

from __future__ import annotations

import argparse
import logging
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from experiments.studies.csv_rows import read_row_list, read_rows, write_row_list
from experiments.studies.paper_v4.jobs import NO_GRADIENT, Job
from experiments.studies.paper_v4.plan import Plan
from experiments.studies.paper_v4.run import COLUMNS, DEFAULT_CSV, run_job

logger = logging.getLogger(__name__)

DEFAULT_OUT = Path("multirun/study/paper_v4_reruns")


def reruns_path(csv_path: str | Path) -> Path:
    """The re-runs sidecar of ``csv_path``: ``<stem>.reruns.csv`` in the same folder."""
    path = Path(csv_path)
    return path.with_name(f"{path.stem}.reruns.csv")


def job_of(row: Mapping[str, Any]) -> Job:
    """The job a study-v4 row records (its key is the row's ``job``)."""
    job = Job(str(row["stage"]), str(row["context"]), str(row["gradient"]), int(row["K"]),
              row["inv_t"], row["lr"], int(row["replicate"]), int(row["epochs"]))  # fmt: skip
    if job.key != row["job"]:
        raise ValueError(f"row {row['job']!r} rebuilds as job {job.key!r}: not a study-v4 row")
    return job


def jobs_to_rerun(
    keys: Sequence[str], rows: Mapping[str, Mapping[str, Any]], plan: Plan
) -> list[Job]:
    """The jobs of ``keys`` (each with an ``ok`` row of ``plan``), each replicate's
    pretraining first. ValueError naming a key without such a row."""
    jobs = []
    for key in keys:
        row = rows.get(key)
        if row is None or row.get("status") != "ok" or row.get("plan") != plan.digest():
            raise ValueError(
                f"rerun: job {key!r} has no ok row of plan {plan.digest()} in the study CSV; "
                "re-run only jobs the study has finished (their keys are its 'job' column)"
            )
        jobs.append(job_of(row))
    pretrained = {j.replicate for j in jobs if j.stage == "pretrain"}
    jobs += [Job("pretrain", "-", NO_GRADIENT, 0, None, None, r, 0)
             for r in {j.replicate for j in jobs} - pretrained]  # fmt: skip
    return sorted(jobs, key=lambda j: (j.stage != "pretrain", j.replicate, j.key))


def rerun(keys: Sequence[str], csv_path: str | Path, out_root: str | Path = DEFAULT_OUT,
          plan: Plan | None = None) -> list[dict[str, Any]]:  # fmt: skip
    """Re-run the jobs ``keys`` of the study CSV in a new folder under ``out_root`` and append
    each row (the pretraining of their replicates included) to the re-runs sidecar as it
    ends. Returns the rows."""
    plan = plan or Plan()
    jobs = jobs_to_rerun(keys, read_rows(csv_path, COLUMNS), plan)
    Path(out_root).mkdir(parents=True, exist_ok=True)
    out_dir = Path(tempfile.mkdtemp(prefix="rerun-", dir=out_root)).resolve()
    sidecar = reruns_path(csv_path)
    done = []
    for job in jobs:
        logger.info("re-running %s in %s", job.key, out_dir)
        row = run_job(job, plan, out_dir)
        write_row_list(sidecar, [*read_row_list(sidecar, COLUMNS), row], COLUMNS)
        done.append(row)
        if row["status"] != "ok":
            logger.warning("%s failed: %s", job.key, row.get("error"))
    return done


def main(argv: Sequence[str] | None = None) -> None:
    """Re-run the given jobs, their rows into the re-runs sidecar."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("jobs", nargs="+", help="job keys of finished rows of the study CSV")
    parser.add_argument("--csv", default=str(DEFAULT_CSV), help="the study's CSV (read only)")
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="where the fresh folder goes")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    rows = rerun(args.jobs, args.csv, args.out)
    print(f"{len(rows)} rows appended to {reruns_path(args.csv)}")


if __name__ == "__main__":
    main()
