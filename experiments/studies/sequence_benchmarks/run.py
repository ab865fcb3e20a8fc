"""Run (or resume) the public-benchmark study (``plan``): every job without an ``ok`` row in
the CSV, ``workers`` at a time, in the plan's priority order (tier, then seed), each trained by
the engine (``run_training`` on the composed ``conf/config.yaml`` + the job's overrides) on one
thread, its row (with provenance: processor, threads, commit, torch) written to the CSV as it
ends (an atomic rewrite: the CSV can be committed at any moment). Interrupt it at any time and
run the same command again: finished jobs are skipped (and a job's own checkpoints resume it).
``--stop-after-minutes``: no job starts after that many minutes of this invocation (the jobs
in flight finish), so a run inside the issue's 120 minutes ends with the top tiers done.

    OMP_NUM_THREADS=1 python -m experiments.studies.sequence_benchmarks.run \\
        multirun/sequence_benchmarks --csv docs/benchmarks_public/runs.csv --workers 2
    python -m experiments.studies.sequence_benchmarks.run --cost   # the projection per tier
"""

from __future__ import annotations

import argparse
import logging
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from hydra.utils import instantiate

import implicit_ham as ih
from experiments.config.groups import TrainConfig
from experiments.engine.build import build_context, build_datasets, build_model, context_channels
from experiments.engine.checkpoint import read_checkpoint
from experiments.engine.file_sinks import read_jsonl
from experiments.engine.provenance import provenance
from experiments.engine.run import run_training
from experiments.models.deq1d import DEQClassifier1d
from experiments.studies.csv_rows import (
    encode_curve,
    read_plan_rows,
    read_rows,
    session_recorder,
    write_rows,
)
from experiments.studies.job_row import compose_overrides, measured_row
from experiments.studies.job_runner import Schedule, run_schedule
from experiments.studies.sequence_benchmarks.plan import (
    BUDGET_MINUTES,
    STUDY,
    TIERS,
    Job,
    Plan,
    add_plan_arguments,
    cost,
    jobs,
    plan_of,
)

logger = logging.getLogger(__name__)

DEFAULT_OUT = Path("multirun/sequence_benchmarks")
DEFAULT_CSV = Path("docs/benchmarks_public/runs.csv")
COLUMNS = (
    "job", "study", "stage", "benchmark", "arm", "seed", "epochs", "plan", "status", "error",
    "accuracy", "epochs_run", "train_s", "s_per_epoch", "forward_steps", "spectral_radius",
    "failures", "curve",
    "parameters", "started", "finished", "peak_mem_mb", "cpu", "threads", "commit", "torch",
)  # fmt: skip
JOB_SETTINGS = ("progress=false", "diagnostics.enabled=false", "logger=files")


def job_row(job: Job, out_dir: Path) -> dict[str, Any]:
    """Train ``job`` in ``out_dir/<key>`` and read its row: final test accuracy (the
    validation split is the test split), epochs run (early stop), time, the accuracy curve
    (epoch: accuracy, encoded), forward steps of the last training solve (mean over implicit
    layers)."""
    job_dir = out_dir / job.key
    cfg = compose_overrides([*job.overrides, *JOB_SETTINGS])
    results = run_training(cfg, job_dir)
    if results.get("status") != "ok":
        raise RuntimeError(f"run_training ended with status {results.get('status')!r}")
    metrics = results["metrics"]
    curve = [(int(r["epoch"]), float(r["val/accuracy"]))
             for r in read_jsonl(job_dir / "metrics.jsonl") if "val/accuracy" in r]  # fmt: skip
    solves = [s for s in results.get("solver", {}).values() if isinstance(s, Mapping)]
    steps = [float(s["steps"]) for s in solves if s.get("steps") is not None]
    epochs_run = int(metrics["epoch"])
    return {
        "accuracy": float(metrics["val/accuracy"]),
        "epochs_run": epochs_run,
        "train_s": float(results["train_time_s"]),
        "s_per_epoch": float(results["train_time_s"]) / max(epochs_run, 1),
        "forward_steps": sum(steps) / len(steps) if steps else None,
        "spectral_radius": deq_spectral_radius(cfg, job_dir) if cfg.model.arch == "deq1d" else None,
        "failures": int(results["failures"].get("total", 0)),
        "curve": encode_curve(curve),
        "parameters": int(results["parameters"]),
    }


def deq_spectral_radius(cfg: TrainConfig, job_dir: Path, probe: int = 64) -> float:
    """ρ(J) of the trained DEQ's cell at the fixed point of the first ``probe`` test sequences
    (a tight solve, 100 steps at tolerance 1e-6; ``ih.diagnostics.estimate_conditioning``),
    the model rebuilt from the job's final checkpoint. Where ρ > 1 the solve does not converge
    and J is taken where its 100 steps end (the page's "Fixed points" paragraph says so)."""
    _, test, info = build_datasets(cfg.data)
    solver, adjoint = instantiate(cfg.solver), instantiate(cfg.adjoint)
    context = build_context(cfg.context, context_channels(info, cfg.model), solver, adjoint)
    model = build_model(info, context, cfg.model, solver, adjoint)
    if not isinstance(model, DEQClassifier1d):
        raise TypeError(f"{job_dir}: model.arch={cfg.model.arch!r} is not a DEQ (deq1d)")
    model.load_state_dict(read_checkpoint(job_dir / "checkpoint.pt")["model"])
    model.eval()
    x = torch.stack([test[i][0] for i in range(min(probe, len(test)))])  # type: ignore[arg-type]
    tight = ih.FixedPointIteration(max_steps=100, tol=1e-6)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the probe's own solve is not a training event
        inj = model.inject(model.stem(x))
        z = ih.fixed_point(model.cell, torch.zeros_like(inj), inj, solver=tight).value
        report = ih.diagnostics.estimate_conditioning(model.cell, z, inj)
    return float(report.spectral_radius)


def run_job(job: Job, plan: Plan, out_dir: Path) -> dict[str, Any]:
    """One job's CSV row (in a worker process, one thread)."""
    base = {"job": job.key, "study": STUDY, "stage": job.stage, "benchmark": job.benchmark,
            "arm": job.arm, "seed": job.seed, "epochs": job.epochs, "plan": plan.digest(),
            **provenance()}  # fmt: skip
    return measured_row(base, job.key, lambda: job_row(job, out_dir))


def pending(plan: Plan, rows: Mapping[str, Mapping[str, Any]]) -> list[Job]:
    """The plan's jobs without an ``ok`` row, in plan order (seed-major)."""
    return [j for j in jobs(plan) if rows.get(j.key, {}).get("status") != "ok"]


def run_study(
    plan: Plan,
    out_dir: Path,
    csv_path: Path,
    workers: int = 2,
    stop_after_minutes: float | None = None,
) -> dict[str, int]:
    """Run every pending job, ``workers`` at a time, in plan order; rows of another plan are
    refused. ``stop_after_minutes``: no job starts once that many minutes have passed since
    this call began (None: run them all)."""
    out_dir, csv_path = Path(out_dir).resolve(), Path(csv_path)
    rows = read_plan_rows(csv_path, COLUMNS, plan.digest())
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    deadline = None if stop_after_minutes is None else time.time() + 60 * stop_after_minutes

    def todo(current: Mapping[str, Mapping[str, Any]]) -> list[Job]:
        if deadline is not None and time.time() >= deadline:
            return []  # past the stop: start nothing more (the jobs in flight finish)
        return pending(plan, current)

    schedule = Schedule(
        pending=todo,
        run=run_job,
        args=(plan, out_dir),
        write=lambda current, _: write_rows(csv_path, current, COLUMNS),
        session=session_recorder(csv_path, workers, plan.digest(), None),
    )
    return run_schedule(schedule, rows, workers)


def projection_text(plan: Plan, workers: int = 2) -> str:
    """The projection per tier (``plan.cost``) as lines: minutes expected / worst case, when
    each tier ends, and whether it ends inside the issue's budget."""
    lines = [f"projection, {workers} workers, from plan.EPOCH_S (a loaded host: an upper bound):"]
    for t in cost(plan, workers):
        inside = "inside" if t.fits else "beyond"
        lines.append(
            f"tier {t.tier} ({TIERS[t.tier]}): {t.jobs} jobs, {t.expected:.0f} min expected "
            f"({t.worst:.0f} worst case), ends at {t.ends_at:.0f} min: {inside} the "
            f"{BUDGET_MINUTES:.0f}-minute budget"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    """Run (or resume) the study into OUT_DIR, its rows into --csv."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", nargs="?", default=str(DEFAULT_OUT))
    parser.add_argument("--csv", default=str(DEFAULT_CSV), help="the study's CSV (resumed)")
    parser.add_argument("--workers", type=int, default=2, help="jobs run at once")
    parser.add_argument("--list", action="store_true", help="print the pending jobs and stop")
    parser.add_argument("--cost", action="store_true", help="print the projected minutes")
    parser.add_argument(
        "--stop-after-minutes", type=float, default=None,
        help="start no job after this many minutes (the jobs in flight finish); resume later",
    )  # fmt: skip
    add_plan_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    plan = plan_of(args)
    if args.cost:
        print(projection_text(plan, args.workers))
        return
    if args.list:
        for job in pending(plan, read_rows(args.csv, COLUMNS)):
            print(job.key, " ".join(job.overrides))
        return
    counts = run_study(
        plan, Path(args.out_dir), Path(args.csv), args.workers, args.stop_after_minutes
    )
    logger.info("ran %(ran)d jobs (%(failed)d failed); %(skipped)d already ok", counts)


if __name__ == "__main__":
    main()
