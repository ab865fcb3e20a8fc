"""Run the generation v3 study: each job through the engine, one results row as each job ends.

    OMP_NUM_THREADS=1 python -m experiments.studies.generation_v3.run pilot multirun/generation_v3
    OMP_NUM_THREADS=1 python -m experiments.studies.generation_v3.run main multirun/generation_v3
    OMP_NUM_THREADS=1 python -m experiments.studies.generation_v3.run pairing multirun/generation_v3
    python -m experiments.studies.generation_v3.report

Every job is composed from the project's configs (``plan.job_overrides``) into the typed
``TrainConfig`` and trained by the engine's ``run_training`` in ``OUT/jobs/<job key>`` (its
checkpoints, resume, preemption and failure policy); its row (final and best val loss, the val
curve, the plateau check, time per step, peak memory, the gate's gamma) is appended to the
results file (``--results``, JSON lines) as the job ends. A job whose row (with this plan's
digest) is in the results file is skipped, so a stopped study resumes from the file; an
interrupted job resumes from its own checkpoints. ``main`` refuses to start until the pilot gate
has passed (``report.gate``), unless ``--skip-gate``.

The ``pairing`` stage trains every arm's pairing classifier (``plan.job_overrides`` with
``pairing``) in ``OUT/pairing/<job key>``, its rows (final and best held-out balanced accuracy,
the accuracy curve, the plateau check of its val loss, time per step, peak memory, gamma) in
their own results file
(``docs/generation_v3/pairing.jsonl`` by default); it does not wait for the gate (it asks
whether each context block can carry the pairing at all).

Each main-stage row also holds the sample metrics of the trained model (``samples``: pair
consistency, kappa, FID / KID, precision / recall in a digit classifier's features, and the
real-data row of its seed), computed from the job's final checkpoint after training
(``with_samples``). The ``samples`` stage back-fills them into rows that lack them, for the
jobs whose checkpoints are in ``OUT/jobs``::

    OMP_NUM_THREADS=1 python -m experiments.studies.generation_v3.run samples multirun/generation_v3
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from experiments.config.groups import TrainConfig
from experiments.engine.file_sinks import read_jsonl
from experiments.engine.preemption import PreemptedError
from experiments.engine.provenance import provenance
from experiments.engine.run import run_training
from experiments.studies.generation_v3.plan import Job, Plan, job_overrides
from experiments.studies.generation_v3.report import gate, plateau_change, read_rows
from experiments.studies.generation_v3.samples import job_samples
from experiments.studies.job_row import compose_overrides, peak_memory_mb, reset_peak_memory
from experiments.studies.job_runner import Schedule, run_schedule

logger = logging.getLogger(__name__)

DEFAULT_OUT = Path("multirun/generation_v3")
DEFAULT_RESULTS = {"pilot": Path("docs/generation_v3/results.jsonl"),
                   "main": Path("docs/generation_v3/results.jsonl"),
                   "samples": Path("docs/generation_v3/results.jsonl"),
                   "pairing": Path("docs/generation_v3/pairing.jsonl")}  # fmt: skip


def compose_job(job: Job, plan: Plan, pairing: bool = False) -> TrainConfig:
    """The typed config of a training job (of the pairing check when ``pairing``)."""
    return compose_overrides(job_overrides(job, plan, pairing))


def val_curve(job_dir: Path, metric: str = "val/loss") -> list[tuple[int, float]]:
    """[(step, ``metric``)] after every epoch, from the job's ``metrics.jsonl``."""
    rows = read_jsonl(job_dir / "metrics.jsonl")
    return [(int(r["step"]), float(r[metric])) for r in rows if metric in r]


def gate_gamma(job_dir: Path) -> float:
    """The context gate's final gamma, from the job's final checkpoint."""
    state = torch.load(job_dir / "checkpoint.pt", map_location="cpu", weights_only=False)
    return float(state["model"]["gate.gamma"])


def _train(job: Job, cfg: TrainConfig, plan: Plan, out_dir: Path, pairing: bool) -> dict[str, Any]:
    """Train ``cfg`` in ``OUT/jobs/<job key>`` (``OUT/pairing/<job key>`` when ``pairing``),
    resuming it; the row's fields every stage shares: the curve of the val loss (of the val
    accuracy when ``pairing``), the plateau check of the val loss, and where it ran
    (``provenance``: processor, threads, library commit, torch version)."""
    job_dir = out_dir / ("pairing" if pairing else "jobs") / job.key
    reset = reset_peak_memory()
    results = run_training(cfg, job_dir)
    if results.get("status") != "ok":
        raise RuntimeError(f"{job.key}: run_training ended with status {results.get('status')!r}")
    curve = val_curve(job_dir, "val/accuracy" if pairing else "val/loss")
    steps = curve[-1][0] if curve else 0
    change = plateau_change([loss for _, loss in val_curve(job_dir)], plan.plateau_share)
    return {
        "job": job.key,
        "arm": job.arm,
        "seed": job.seed,
        "status": "ok",
        "plan": plan.pairing_digest() if pairing else plan.digest(),
        "curve": curve,
        "steps": steps,
        "train_time_s": float(results["train_time_s"]),
        "time_per_step_s": float(results["train_time_s"]) / max(steps, 1),
        "peak_memory_mb": peak_memory_mb(reset),
        "gamma": gate_gamma(job_dir),
        "parameters": results.get("parameters"),
        "failures": results.get("failures", {}).get("total"),
        "val_loss": float(results["metrics"]["val/loss"]),
        "plateau_change": change,
        "at_plateau": change is not None and change < plan.plateau_tol,
        "results": results,
        **provenance(),
    }


def run_job(job: Job, plan: Plan, out_dir: Path) -> dict[str, Any]:
    """Train the masked-cell ``job`` (resuming its directory) and return its results row, with
    the sample metrics of the trained model (``with_samples``)."""
    cfg = compose_job(job, plan)
    row = _train(job, cfg, plan, out_dir, pairing=False)
    best = row.pop("results").get("best")
    row["best_val_loss"] = float(best["val/loss"]) if best else None
    return with_samples(row, cfg, out_dir)


def with_samples(row: dict[str, Any], cfg: TrainConfig, out_dir: Path) -> dict[str, Any]:
    """``row`` with the sample metrics of its job's final checkpoint in
    ``OUT/jobs/<job key>`` (``samples.job_samples``, the classifiers cached in
    ``OUT/classifiers``) and the seconds they took (``samples_time_s``, the classifier's
    training included when it was not cached). An evaluation after training: the training
    and its held-out loss are the same with or without it. When the metrics fail the row keeps
    its training results and says why (``samples_error``; the page counts it as not measured)."""
    start = time.perf_counter()
    try:
        extra = job_samples(cfg, out_dir / "jobs" / row["job"], out_dir / "classifiers")
    except (RuntimeError, ValueError, OSError, KeyError) as error:
        logger.warning("%s: sample metrics failed: %s", row["job"], error)
        return row | {"samples_error": f"{type(error).__name__}: {error}"}
    return row | extra | {"samples_time_s": time.perf_counter() - start}


def run_pairing_job(job: Job, plan: Plan, out_dir: Path) -> dict[str, Any]:
    """Train ``job``'s pairing classifier (resuming its directory) and return its row: the
    held-out accuracy, which is the balanced accuracy (the val set is half real, half
    recombined: ``experiments.data.far_twins.pairing_canvases``)."""
    row = _train(job, compose_job(job, plan, pairing=True), plan, out_dir, pairing=True)
    results = row.pop("results")
    accuracies = [accuracy for _, accuracy in row["curve"]]
    return row | {
        "balanced_accuracy": float(results["metrics"]["val/accuracy"]),
        "best_balanced_accuracy": max(accuracies) if accuracies else None,
    }


def append_row(path: Path, row: dict[str, Any]) -> None:
    """Append one JSON line to ``path`` (created with its folder) and flush it to disk."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps(row, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())


def pending(jobs: Sequence[Job], digest: str, results: Path) -> list[Job]:
    """The jobs without an ``ok`` row of the plan ``digest`` in ``results``."""
    done = {r["job"] for r in read_rows(results) if r["plan"] == digest}
    return [job for job in jobs if job.key not in done]


def _worker(job: Job, stage: str, plan: Plan, out_dir: Path) -> dict[str, Any]:
    """Run ``job`` of ``stage`` on one thread; its row, or, when the job was preempted
    (``PreemptedError``: it checkpointed, and the next run resumes it), a ``preempted`` row
    that the results file does not keep."""
    torch.set_num_threads(1)
    try:
        return (run_pairing_job if stage == "pairing" else run_job)(job, plan, out_dir)
    except PreemptedError as stopped:
        logger.warning("%s", stopped)
        return {"job": job.key, "status": "preempted", "error": f"PreemptedError: {stopped}"}


def run_stage(
    stage: str, out_dir: Path, results: Path, plan: Plan, workers: int = 1, skip_gate: bool = False
) -> int:
    """Run the stage's pending jobs (``workers`` processes; ``job_runner.run_schedule``), each
    row appended to ``results`` as its job ends; returns the number run."""
    if stage == "main" and not skip_gate:
        verdict = gate(read_rows(results), plan)
        if not verdict.passed:
            raise SystemExit(f"main: the pilot gate has not passed ({verdict.summary}); "
                             "run the pilot first, or pass --skip-gate")  # fmt: skip
    if stage == "pairing":
        jobs = pending(plan.pairing_jobs(), plan.pairing_digest(), results)
    else:
        jobs = pending(plan.pilot_jobs() if stage == "pilot" else plan.main_jobs(),
                       plan.digest(), results)  # fmt: skip
    logger.info("%s: %d job(s) to run", stage, len(jobs))

    def store(_: Mapping[str, dict[str, Any]], row: dict[str, Any]) -> None:
        if row["status"] != "preempted":
            append_row(results, row)

    schedule = Schedule(
        pending=lambda _: jobs, run=_worker, args=(stage, plan, out_dir), write=store
    )
    return run_schedule(schedule, {}, workers)["ran"]


def backfill_samples(out_dir: Path, results: Path, plan: Plan) -> int:
    """Append, for every row of this plan in ``results`` without sample metrics whose job's
    final checkpoint is in ``OUT/jobs``, the row with them (``with_samples``; a later row of a
    job replaces the earlier one). Returns the number of rows measured; rows whose checkpoint
    is missing are counted in the log."""
    rows = [r for r in read_rows(results) if r["plan"] == plan.digest() and "samples" not in r]
    ready = [r for r in rows if (out_dir / "jobs" / r["job"] / "checkpoint.pt").exists()]
    logger.info("samples: %d row(s) without sample metrics, %d with a checkpoint in %s",
                len(rows), len(ready), out_dir / "jobs")  # fmt: skip
    for row in ready:
        cfg = compose_job(Job(row["arm"], int(row["seed"])), plan)
        clean = {k: v for k, v in row.items() if k != "samples_error"}
        append_row(results, with_samples(clean, cfg, out_dir))
    return len(ready)


def main(argv: Sequence[str] | None = None) -> None:
    """Command line (module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stage", choices=tuple(DEFAULT_RESULTS))
    parser.add_argument("out", type=Path, nargs="?", default=DEFAULT_OUT)
    parser.add_argument("--results", type=Path, default=None, help="default: the stage's file")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--skip-gate", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    start = time.perf_counter()
    results = args.results or DEFAULT_RESULTS[args.stage]
    if args.stage == "samples":
        count = backfill_samples(args.out, results, Plan())
    else:
        count = run_stage(args.stage, args.out, results, Plan(), args.workers, args.skip_gate)
    logger.info("%s: %d job(s) in %.0f s", args.stage, count, time.perf_counter() - start)


if __name__ == "__main__":
    main()
