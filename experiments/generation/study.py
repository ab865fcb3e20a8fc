"""The generation comparison of ``docs/generation.md``: a pilot gate, then the main sweep.

Phases (``JOBS``):

* ``pilot``: no context vs self-attention over ``PILOT_SEEDS``; the task qualifies only if
  self-attention's consistency beats no context's with a paired 95 % interval above 0
  (``experiments.generation.paired.pilot_gate``);
* ``main``: every arm of ``experiments.generation.job.ARMS`` over ``MAIN_SEEDS`` (the pilot's jobs
  are main jobs too and are not run again). It refuses to start when the results file's pilot
  jobs do not pass the gate (the command then logs why and exits with status 0, so that
  ``make generate`` goes on to write the page that reports the gate; ``--force`` runs it anyway).

Every finished job appends one JSON line to the results file (``RESULTS``, committed: the page is
written from it alone) and a job whose line is there with the same definition is skipped, so a
run resumes where it stopped, also on a fresh machine. Jobs run in worker processes (one thread
each, one process per job, so a job's peak memory is its own), ``--workers`` at a time.

    python -m experiments.generation.study pilot OUT_DIR --results docs/generation/results.jsonl
    python -m experiments.generation.study main OUT_DIR --results docs/generation/results.jsonl
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import os
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any, TypeVar

import torch

from experiments.generation.classifier import load_or_train_classifier
from experiments.generation.job import ARMS, GanJob, run_job
from experiments.generation.paired import pilot_gate
from experiments.models.digit_classifier import HalfDigitClassifier

T = TypeVar("T")
logger = logging.getLogger(__name__)

RESULTS = "docs/generation/results.jsonl"
PILOT_ARMS = ("none", "self_attention")
PILOT_SEEDS = (0, 1, 2)
MAIN_SEEDS = (0, 1, 2, 3, 4)
CLASSIFIER_FILE = "classifier.pt"
MIN_CLASSIFIER_ACCURACY = 0.95


class GateNotPassedError(RuntimeError):
    """The main sweep was asked for while the results file's pilot jobs fail the gate."""


def phase_jobs(phase: str) -> list[GanJob]:
    """The jobs of ``phase`` ("pilot" or "main"), seeds outer (every arm of a seed first)."""
    if phase == "pilot":
        return [GanJob(arm, seed) for seed in PILOT_SEEDS for arm in PILOT_ARMS]
    if phase == "main":
        return [GanJob(arm, seed) for seed in MAIN_SEEDS for arm in ARMS]
    raise ValueError(f"phase must be 'pilot' or 'main', got {phase!r}")


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a results file (one JSON object a line); [] when it does not exist."""
    path = Path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def finished(rows: list[dict[str, Any]], job: GanJob) -> dict[str, Any] | None:
    """The row of ``job`` (same name and definition) among ``rows``, else None."""
    for row in rows:
        if row.get("job") == job.name and row.get("definition") == job.definition():
            return row
    return None


def append_row(path: str | Path, row: dict[str, Any]) -> None:
    """Append ``row`` as one JSON line to ``path`` (created with its folder if needed)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        handle.write(json.dumps(row, sort_keys=True) + "\n")


def metrics_classifier(out_dir: str | Path) -> tuple[HalfDigitClassifier, float]:
    """The metrics' half-canvas classifier of the far-twin layout (30 epochs, the digits' split
    of seed 0 with 20 % held out), cached in ``out_dir`` and shared by the jobs."""
    return load_or_train_classifier(Path(out_dir) / CLASSIFIER_FILE, 30, 0.2, 0, "far")


def _worker(job: GanJob, out_dir: str) -> dict[str, Any]:
    torch.set_num_threads(1)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    classifier, accuracy = metrics_classifier(out_dir)
    grid = Path(out_dir) / job.name / "samples.png"
    start = time.perf_counter()
    row = run_job(job, classifier, accuracy, str(grid))
    row["wall_s"] = time.perf_counter() - start
    (Path(out_dir) / job.name / "row.json").write_text(json.dumps(row, indent=1))
    return row


def _worker_of(args: tuple[GanJob, str]) -> dict[str, Any]:
    return _worker(*args)


def run_phase(phase: str, out_dir: str | Path, results: str | Path, workers: int = 2,
              force: bool = False) -> list[dict[str, Any]]:  # fmt: skip
    """Run the jobs of ``phase`` not yet in ``results`` (module docstring); returns all rows of
    the phase's jobs."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = read_rows(results)
    if phase == "main" and not force:
        gate = pilot_gate(rows)
        if not gate.passed:
            raise GateNotPassedError(
                f"the pilot gate did not pass ({gate.summary}); the main sweep would compare arms "
                "on a task that does not need context. Change the design, or pass --force"
            )
    jobs = phase_jobs(phase)
    todo = [job for job in jobs if finished(rows, job) is None]
    logger.info("%s: %d jobs, %d finished, %d to run", phase, len(jobs), len(jobs) - len(todo),
                len(todo))  # fmt: skip
    if todo:
        _run_jobs(todo, out_dir, results, workers)
    rows = read_rows(results)
    return [row for job in jobs if (row := finished(rows, job)) is not None]


def in_workers(fn: Callable[[Any], T], items: Sequence[Any], workers: int,
               names: Sequence[str]) -> Iterator[T]:  # fmt: skip
    """``fn(item)`` for every item, each in a fresh spawned process of its own (so a job's peak
    memory is its own), ``workers`` at a time, yielded as they finish. A worker that dies
    (killed, out of memory) raises RuntimeError naming the unfinished items (``names``) instead
    of leaving them waiting forever, as ``multiprocessing.Pool`` would."""
    context = multiprocessing.get_context("spawn")
    pending = list(zip(items, names, strict=True))
    running: dict[Future[T], tuple[str, ProcessPoolExecutor]] = {}
    try:
        while pending or running:
            while pending and len(running) < workers:
                item, name = pending.pop(0)
                executor = ProcessPoolExecutor(1, mp_context=context)
                running[executor.submit(fn, item)] = (name, executor)
            done, _ = wait(list(running), return_when=FIRST_COMPLETED)
            for future in done:
                name, executor = running.pop(future)
                executor.shutdown(wait=False)
                try:
                    yield future.result()
                except BrokenProcessPool as err:
                    lost = sorted([name, *(n for n, _ in running.values()),
                                   *(n for _, n in pending)])  # fmt: skip
                    raise RuntimeError(
                        f"a worker process died (killed or out of memory); not finished: "
                        f"{', '.join(lost)}. Finished jobs are kept: run the same command again "
                        "to run the rest"
                    ) from err
    finally:
        for _, executor in running.values():
            executor.shutdown(wait=False, cancel_futures=True)


def _run_jobs(todo: list[GanJob], out_dir: Path, results: str | Path, workers: int) -> None:
    """Run ``todo`` in ``workers`` processes, appending each row to ``results`` as it ends."""
    _, accuracy = metrics_classifier(out_dir)
    if accuracy < MIN_CLASSIFIER_ACCURACY:
        raise RuntimeError(
            f"the metrics' classifier reached {accuracy:.4f} held-out accuracy, below "
            f"{MIN_CLASSIFIER_ACCURACY}: FID and consistency would not be trustworthy"
        )
    start = time.perf_counter()
    for row in in_workers(_worker_of, [(job, str(out_dir)) for job in todo], workers,
                          [job.name for job in todo]):  # fmt: skip
        append_row(results, row)
        logger.info("%s done: fid %.2f consistency %.3f (%.0f s)", row["job"], row["fid"],
                    row["consistency"], row["wall_s"])  # fmt: skip
    logger.info("%d jobs: %.1f min wall", len(todo), (time.perf_counter() - start) / 60)


def main(argv: list[str] | None = None) -> None:
    """Parse the command line and run the phase."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("phase", choices=("pilot", "main"))
    parser.add_argument("out_dir", nargs="?", default="multirun/generate_v2")
    parser.add_argument("--results", default=RESULTS)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--force", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        run_phase(args.phase, args.out_dir, args.results, args.workers, args.force)
    except GateNotPassedError as stop:  # the page reports the gate; nothing else to run
        logger.warning("%s", stop)


if __name__ == "__main__":
    main()
