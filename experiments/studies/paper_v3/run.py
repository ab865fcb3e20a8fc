"""The paper-regime study v3: independent replicates, a held-out test split, tuned arms, the
temperature and K axes, one committed CSV row per job.

Stages and selection: ``experiments.studies.paper_v3.plan``. Every training job is composed
from the project's configs (``conf/config.yaml`` + ``+experiment=paper_v3`` + ``+arm=<arm>``
+ the job's overrides) into the typed ``TrainConfig`` and trained by the engine's
``run_training`` in ``OUT/jobs/<job key>``; afterwards its test metrics, val curve and (one-step
arms) gradient fidelity are read (``experiments.studies.paper_v3.eval``) and its row is written
to the CSV (``experiments.studies.csv_rows``), atomically, as each job ends. A job whose
row says ``ok`` (with this plan) is skipped without touching ``OUT``, so the study resumes from
the committed CSV alone on a fresh machine; a replicate's backbone
(``OUT/pretrain/replicate<r>.pt``) is rebuilt, deterministically, only when a job that still
has to run needs it.

    OMP_NUM_THREADS=1 python -m experiments.studies.paper_v3 multirun/study_v3 \\
        --csv docs/results/paper_v3.csv --workers 2
    python -m experiments.report --from-csv docs/results/paper_v3.csv --out docs
"""

from __future__ import annotations

import argparse
import logging
import resource
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import torch
from hydra import compose, initialize_config_dir

from experiments.config.groups import TrainConfig, register_configs
from experiments.config.typed import typed_config
from experiments.engine.run import run_training
from experiments.studies.csv_rows import (
    COLUMNS,
    append_session,
    encode_curve,
    read_rows,
    write_rows,
)
from experiments.studies.job_runner import Schedule, run_schedule
from experiments.studies.paper_v3 import eval as job_eval
from experiments.studies.paper_v3.plan import (
    REGIME,
    STUDY,
    THROUGH_BASES,
    Job,
    Plan,
    all_jobs,
    tune_jobs,
)
from experiments.studies.pretraining import PretrainConf, ensure_pretrained

logger = logging.getLogger(__name__)

CONF_DIR = Path(__file__).resolve().parents[3] / "conf"
DEFAULT_OUT = Path("multirun/study_v3")
DEFAULT_CSV = Path("docs/results/paper_v3.csv")


class StudyPlan(Protocol):
    """What the shared pieces read of a study's plan (v3's or v4's)."""

    @property
    def pretrain_steps(self) -> int: ...

    @property
    def pretrain_images(self) -> int: ...

    def data_seed(self, replicate: int) -> int: ...

    def digest(self) -> str: ...


def backbone_path(out_dir: Path, replicate: int) -> Path:
    """Where a replicate's pretrained backbone lives (absolute)."""
    return (out_dir / "pretrain" / f"replicate{replicate}.pt").resolve()


def pretrain_conf(plan: StudyPlan, replicate: int) -> PretrainConf:
    """The replicate's pretraining: its own seed and its own train scans."""
    return PretrainConf(
        images=plan.pretrain_images,
        steps=plan.pretrain_steps,
        seed=replicate,
        scan_seed=plan.data_seed(replicate),
    )


def job_overrides(
    job: Job, plan: StudyPlan, out_dir: Path, preset: str = "paper_v3", arm: str | None = None
) -> list[str]:
    """The Hydra overrides that make ``job`` out of a study preset (``+experiment=<preset>``)
    and its arm (default ``job.arm``), before the plan's own ``overrides``."""
    data_seed = plan.data_seed(job.replicate)
    overrides = [
        f"+experiment={preset}",
        f"+arm={arm or job.arm}",
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
    return overrides


def compose_overrides(overrides: Sequence[str]) -> TrainConfig:
    """The typed config of ``conf/config.yaml`` with ``overrides``."""
    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=list(overrides))
    return typed_config(cfg, TrainConfig)


def compose_job(job: Job, plan: Plan, out_dir: Path) -> TrainConfig:
    """The typed config of a training job."""
    return compose_overrides([*job_overrides(job, plan, out_dir), *plan.overrides])


def _reset_peak_memory() -> bool:
    """Reset this process's peak RSS (Linux ``clear_refs``); False where that is unavailable."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def _peak_memory_mb(reset: bool) -> float:
    """Peak RSS of this process since the reset (else since it started), MiB."""
    if reset:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _base_row(job: Job, plan: Plan) -> dict[str, Any]:
    return {
        "job": job.key,
        "study": STUDY,
        "stage": job.stage,
        "regime": REGIME,
        "context": job.context,
        "gradient": job.gradient,
        "K": job.K,
        "inv_t": job.inv_t,
        "lr": job.lr,
        "replicate": job.replicate,
        "data_seed": plan.data_seed(job.replicate),
        "model_seed": job.replicate,
        "epochs": job.epochs,
        "plan": plan.digest(),
    }


def pretrain_row(job: Job, plan: StudyPlan, out_dir: Path) -> dict[str, Any]:
    artefact = ensure_pretrained(
        backbone_path(out_dir, job.replicate), pretrain_conf(plan, job.replicate)
    )
    return {
        "steps": plan.pretrain_steps,
        "val_pixel_acc": artefact["val_pixel_acc"],
        "train_s": artefact["seconds"],
    }


def train_row(cfg: TrainConfig, job_dir: Path, fidelity: str | None) -> dict[str, Any]:
    """Train ``cfg`` in ``job_dir`` and read its row: final val metrics, test metrics, val
    curve, train time and, with ``fidelity`` (ONE_STEP or THROUGH_BASES), the gradient
    fidelity along training; then prune the step checkpoints."""
    results = run_training(cfg, job_dir)
    if results.get("status") != "ok":
        raise RuntimeError(f"run_training ended with status {results.get('status')!r}")
    metrics = results["metrics"]
    splits = job_eval.build_splits(cfg)
    curve = job_eval.val_curve(job_dir)
    fidelity_points: list[tuple[int, float]] = []
    if fidelity is not None:
        fidelity_points = job_eval.fidelity_curve(cfg, job_dir, splits, fidelity == THROUGH_BASES)
    row = {
        "steps": curve[-1][0] if curve else None,
        "val_miou": metrics["val/miou"],
        "val_pixel_acc": metrics["val/pixel_acc"],
        "val_loss": metrics["val/loss"],
        **job_eval.test_metrics(cfg, job_dir, splits),
        "val_curve": curve,
        "fidelity": fidelity_points,
        "train_s": results["train_time_s"],
    }
    job_eval.prune_checkpoints(job_dir)
    return row


def _train(job: Job, plan: Plan, out_dir: Path) -> dict[str, Any]:
    fidelity = job.gradient if job.gradient in ("one_step", THROUGH_BASES) else None
    return train_row(compose_job(job, plan, out_dir), out_dir / "jobs" / job.key, fidelity)


def measured_row(
    row: dict[str, Any], job_key: str, work: Callable[[], dict[str, Any]]
) -> dict[str, Any]:
    """``row`` updated with ``work()``'s result (curves encoded) and ``status: ok``, or, when
    it raises, ``status: failed`` and the error (the study goes on; a resumed study retries
    it); plus start / end time and peak memory. Runs on one thread."""
    torch.set_num_threads(1)
    reset = _reset_peak_memory()
    started = time.time()
    try:
        result = work()
        for name in ("val_curve", "fidelity"):
            if name in result:
                result[name] = encode_curve(result[name])
        row.update(result, status="ok")
    except Exception as error:  # recorded in the row; the study continues
        logger.exception("%s failed", job_key)
        row.update(status="failed", error=f"{type(error).__name__}: {error}"[:300])
    row.update(started=started, finished=time.time(), peak_mem_mb=_peak_memory_mb(reset))
    return row


def run_job(job: Job, plan: Plan, out_dir: Path) -> dict[str, Any]:
    """Run one job (in a worker process) and return its CSV row (``measured_row``)."""

    def work() -> dict[str, Any]:
        if job.stage == "pretrain":
            return pretrain_row(job, plan, out_dir)
        return _train(job, plan, out_dir)

    return measured_row(_base_row(job, plan), job.key, work)


def ready(job: Job, out_dir: Path, settled_pretrain: set[int]) -> bool:
    """A training job can start once its replicate's backbone exists."""
    if job.stage == "pretrain":
        return True
    return job.replicate in settled_pretrain or backbone_path(out_dir, job.replicate).exists()


def pending_jobs(plan: Plan, rows: dict[str, dict[str, Any]], out_dir: Path) -> list[Job]:
    """The jobs still to run: every known job without an ``ok`` row, and the pretraining of
    each replicate whose backbone is missing while such a job (or a main / K-axis job not yet
    known, before tuning is settled) needs it."""
    tuned = all(k.key in rows for k in tune_jobs(plan, rows))
    return pending(all_jobs(plan, rows), rows, out_dir,
                   set() if tuned else set(range(plan.replicates)))  # fmt: skip


def pending(
    jobs: Sequence[Job], rows: dict[str, dict[str, Any]], out_dir: Path, needed: set[int]
) -> list[Job]:
    """Of ``jobs``: the training jobs without an ``ok`` row, and the pretraining of each
    replicate that one of them (or ``needed``) trains on whose backbone is missing."""
    todo = [j for j in jobs if j.stage != "pretrain" and rows.get(j.key, {}).get("status") != "ok"]
    needed = needed | {j.replicate for j in todo}

    def missing(job: Job) -> bool:
        ok = rows.get(job.key, {}).get("status") == "ok"
        return not ok or not backbone_path(out_dir, job.replicate).exists()

    pretrain = [j for j in jobs if j.stage == "pretrain" and j.replicate in needed and missing(j)]
    return pretrain + todo


def check_plan(rows: dict[str, dict[str, Any]], plan: StudyPlan, csv_path: Path) -> None:
    other = sorted({str(r["plan"]) for r in rows.values()} - {plan.digest()})
    if other:
        raise ValueError(
            f"{csv_path} holds rows of another plan ({other}, this one is {plan.digest()}); "
            "use another --csv or the plan that wrote it"
        )


def run_study(plan: Plan, out_dir: Path, csv_path: Path, workers: int = 2) -> dict[str, int]:
    """Run every job not yet ``ok`` in ``csv_path``, ``workers`` at a time (1: in this
    process), writing each row as its job ends. Returns counts: ran, failed, skipped."""
    return run_csv_study(
        plan, out_dir, csv_path, workers, pending=pending_jobs, run=run_job, columns=COLUMNS,
        # pretraining first, then the longest jobs: no long job is left alone at the end
        order=lambda job: (job.stage != "pretrain", -job.epochs),
    )  # fmt: skip


def run_csv_study(
    plan: Any, out_dir: Path, csv_path: Path, workers: int, *,
    pending: Callable[[Any, dict[str, dict[str, Any]], Path], list[Job]],
    run: Callable[[Job, Any, Path], dict[str, Any]],
    order: Callable[[Job], Any],
    columns: Sequence[str],
) -> dict[str, int]:  # fmt: skip
    """A paper study's run (``job_runner.run_schedule``) on its CSV of ``columns``: its rows
    read (refused when of another plan), ``pending(plan, rows, out_dir)`` jobs started in
    ``order`` once their backbone exists, each ``run(job, plan, out_dir)`` row written as it
    ends, and the invocation appended to the sessions sidecar."""
    out_dir, csv_path = Path(out_dir).resolve(), Path(csv_path)
    rows = read_rows(csv_path, columns)
    check_plan(rows, plan, csv_path)

    def session(started: float, finished: float, ran: int) -> None:
        append_session(csv_path, {"started": started, "finished": finished, "jobs_run": ran,
                                  "workers": workers, "plan": plan.digest(),
                                  "main_epochs": plan.main_epochs})  # fmt: skip

    schedule = Schedule(
        pending=lambda current: pending(plan, dict(current), out_dir),
        ready=lambda job, settled: ready(job, out_dir, settled),
        order=order,
        run=run,
        args=(plan, out_dir),
        write=lambda current: write_rows(csv_path, current, columns),
        session=session,
    )
    return run_schedule(schedule, rows, workers)


def main(argv: Sequence[str] | None = None) -> None:
    """Run (or resume) the study into OUT_DIR, its rows into --csv."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", nargs="?", default=str(DEFAULT_OUT))
    parser.add_argument("--csv", default=str(DEFAULT_CSV), help="the study's CSV (resumed)")
    parser.add_argument("--workers", type=int, default=2, help="jobs run at once")
    parser.add_argument("--list", action="store_true", help="print the pending jobs and stop")
    parser.add_argument("--main-epochs", type=int, default=Plan.main_epochs,
                        help="epochs of the main arms (a longer-training check; the report "
                        "reads the default plan's)")  # fmt: skip
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    run_command(Plan(main_epochs=args.main_epochs), args, pending_jobs, run_study, COLUMNS)


def run_command(
    plan: Any, args: argparse.Namespace,
    pending: Callable[[Any, dict[str, dict[str, Any]], Path], list[Job]],
    run: Callable[[Any, Path, Path, int], dict[str, int]],
    columns: Sequence[str],
) -> None:  # fmt: skip
    """A study runner's command line: ``--list`` logs the pending jobs, else ``run(plan,
    out_dir, csv, workers)`` and its counts."""
    if args.list:
        rows = read_rows(args.csv, columns)
        for job in pending(plan, rows, Path(args.out_dir).resolve()):
            logger.info("%s %s", job.stage, job.key)
        return
    counts = run(plan, Path(args.out_dir), Path(args.csv), args.workers)
    logger.info("ran %(ran)d jobs (%(failed)d failed); %(skipped)d already ok", counts)
    if counts["failed"]:
        logger.warning("some jobs failed; run the same command again to retry them")


if __name__ == "__main__":
    main()
