"""Checkpoint and resume of an ``experiments.train`` job.

A job's checkpoints live in ``<job dir>/checkpoints/step-<step>.pt`` (see
``training.checkpoint``). Each holds the model, optimiser and scheduler states, the
``TrainState`` (epoch, batch within the epoch, step, running loss, best metric), every rank's
RNG states, failure counts and partial sums of the epoch's training loss, the number of rows
each metric file had (and each CSV's header), the run's totals so far (cumulative train time,
last solver statistics) and the config. Running the same command again in the same directory
resumes from the newest good checkpoint: the metric files are cut back to their rows at that
checkpoint (so rows logged after it and before the crash do not appear twice; a file with fewer
rows than recorded, or a CSV that lost its header, refuses the resume with ``ResumeLogError``
naming it), and training continues as if it had never stopped. A job that starts from scratch
(no checkpoint, or every one is bad: each is then moved aside as ``.corrupt`` and named in an
error log line) removes the metric files of the earlier attempt. A garbled ``results.json`` is
moved aside as ``results.json.corrupt`` (logged, naming it) and the job resumes from its
checkpoints, so the next ``results.json`` reports the whole run again.

Two settings that change the numbers may still differ on resume, by choice:

* the process count (``reliability.world_size_change``): "refuse" (default,
  ``ResumeConflictError``) or "reshard": the remaining batches of the epoch are re-sliced over
  the new ranks (the samples consumed so far, ``batch * batch_size * old_world_size``, are
  skipped in the same global order, rounded down to whole new global batches), every new rank
  takes the RNG state of old rank ``rank % old_world_size`` and rank 0 carries all failure
  counts. The run continues, but it is not bit-identical to an uninterrupted one.
* the CPU threads (``reliability.threads_change``): checkpoints record
  ``torch.get_num_threads()``; another count on resume changes the float reduction order and
  hence the weights (3e-3 measured after a resume with 2 threads instead of 1), so it is
  "refuse"d by default, or run with a "warn"ing naming both counts.
"""

from __future__ import annotations

import csv
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from experiments.config.groups import TrainConfig
from experiments.config.typed import as_container
from experiments.engine.checkpoint import CheckpointError, CheckpointStore, read_checkpoint
from experiments.engine.distributed import DistributedContext
from experiments.engine.results import RESULTS_FILE, ResultsError, read_results
from experiments.engine.run_events import events_summary
from experiments.engine.state import TrainState
from implicit_ham.reliability.failures import FailureMonitor
from implicit_ham.reliability.guard import unwrap
from implicit_ham.reliability.rng import capture_rng_state, restore_rng_state

logger = logging.getLogger(__name__)

CHECKPOINT_DIR = "checkpoints"
# Settings that may differ between a run and its resumption (they change no number).
RUN_SETTINGS = ("progress", "threads", "log_every", "logger", "diagnostics")
RUN_RELIABILITY = (
    "resume",
    "checkpoint_every",
    "keep",
    "warn_first",
    "warn_every",
    "preempt_signals",
    "max_consecutive_skips",
    "max_skips",
    "dist_timeout_s",
    "divergence_factor",
    "divergence_steps",
    "world_size_change",
    "threads_change",
)
WORLD_SIZE_CHANGES = ("refuse", "reshard")
THREADS_CHANGES = ("refuse", "warn")


class ResumeConflictError(ValueError):
    """The job directory holds checkpoints of another run (different config or process count);
    the directory is left untouched."""


def comparable_config(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The config as plain data (``experiments.config.typed.as_container``, as checkpoints store
    it) without the settings a resumed run may change (``RUN_SETTINGS``); the default ``dtype``
    (float32) is left out too, so checkpoints written before that option existed still
    match."""
    out = {k: v for k, v in cfg.items() if k not in RUN_SETTINGS}
    if out.get("dtype") == "float32":
        del out["dtype"]
    if isinstance(out.get("reliability"), Mapping):
        out["reliability"] = {
            k: v for k, v in out["reliability"].items() if k not in RUN_RELIABILITY
        }
    return out


def config_differences(old: Any, new: Any, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two nested configs."""
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        keys = sorted(set(old) | set(new))
        return [
            d for k in keys for d in config_differences(old.get(k), new.get(k), f"{prefix}{k}.")
        ]
    return [] if old == new else [prefix.rstrip(".")]


@dataclass(frozen=True)
class CheckpointExtras:
    """What a job's checkpoints carry beside the training state, each a callable whose
    plain-data result is stored at every save.

    Attributes:
        totals: (rank 0) e.g. the cumulative train time and the last solver statistics; after
            ``JobCheckpoints.restore`` available as ``restored_totals`` so that the results of
            a resumed run cover the whole run.
        rank_totals: called on every rank, e.g. the rank's warning-event counts; stored per
            rank and, after ``restore``, this rank's is ``restored_rank_totals`` (after a
            reshard: rank 0 gets every old rank's ``{key: {source: {kind: n}}}`` counts summed,
            the others none).
        rank_state: called on every rank, e.g. the rank's loss-divergence check; stored per
            rank and, after ``restore``, is ``restored_rank_state`` (old rank
            ``rank % old_world_size``'s, as the RNG states).
    """

    totals: Callable[[], dict[str, Any]]
    rank_totals: Callable[[], dict[str, Any]]
    rank_state: Callable[[], dict[str, Any]]


class JobCheckpoints:
    """Saves and restores the training state of one job (collective under data parallelism:
    every rank calls ``save``/``restore`` at the same step; rank 0 reads and writes files).

    Args:
        output_dir: the job directory.
        cfg: the typed config (``reliability.keep`` and ``reliability.resume`` are read; its
            ``comparable_config`` is stored and compared).
        model, optimizer: what is saved and restored (the model may be wrapped).
        monitor: the failure monitor whose counts are saved.
        dist: the process group context.
        extras: what else a checkpoint carries (``CheckpointExtras``).
    """

    def __init__(
        self,
        output_dir: Path,
        cfg: TrainConfig,
        *,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        monitor: FailureMonitor,
        dist: DistributedContext,
        extras: CheckpointExtras,
    ) -> None:
        self.output_dir, self.cfg, self.dist, self.extras = output_dir, cfg, dist, extras
        self.restored_totals: dict[str, Any] = {}
        self.restored_rank_totals: dict[str, Any] = {}
        self.restored_rank_state: dict[str, Any] = {}
        self.config = comparable_config(as_container(cfg))
        self.model, self.optimizer, self.monitor = model, optimizer, monitor
        self.store = CheckpointStore(output_dir / CHECKPOINT_DIR, keep=cfg.reliability.keep)
        self.resume = cfg.reliability.resume

    def save(self, state: TrainState) -> None:
        """Write a checkpoint of ``state`` (rank 0), with every rank's RNG and failure counts."""
        ranks = self.dist.gather(
            {
                "rng": capture_rng_state(),
                "failures": self.monitor.state_dict(),
                "totals": self.extras.rank_totals(),
                "loss": [state.loss_sum, state.loss_count],  # this rank's partial sums
                "state": self.extras.rank_state(),
            }
        )
        if not self.dist.is_main:
            return
        payload = {
            "config": self.config,
            "world_size": self.dist.world_size,
            "threads": torch.get_num_threads(),
            "train_state": state.state_dict(),
            "model": unwrap(self.model).state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "ranks": ranks,
            "logs": log_rows(self.output_dir),
            "log_headers": csv_headers(self.output_dir),
            "totals": self.extras.totals(),
        }
        path = self.store.save(state.step, payload)
        logger.debug("checkpoint %s (epoch %d, batch %d)", path, state.epoch, state.batch)

    def restore(self) -> TrainState | None:
        """Load the newest good checkpoint into the model, optimiser, RNGs and
        monitor and return its ``TrainState``; None when starting from scratch (no checkpoint,
        or ``reliability.resume=false``, which deletes the old checkpoints, or every checkpoint
        is bad: each was moved aside as ``.corrupt``, and the error names them). A fresh start
        removes the metric files of an earlier attempt (``metrics.jsonl`` / ``metrics.csv`` /
        ``tables/*``), so that no row is logged twice."""
        path = None
        if self.dist.is_main:
            if not self.resume:
                self.store.clear()
            else:
                latest = latest_or_none(self.store)
                path = None if latest is None else str(latest[0])
        path = self.dist.broadcast(path)
        if path is None:
            if self.dist.is_main:
                truncate_logs(self.output_dir)
            return None
        payload = read_checkpoint(path)
        self._check_compatible(Path(path), payload)
        recorded = payload["logs"], payload.get("log_headers", {})
        shortfall = log_shortfall(self.output_dir, *recorded) if self.dist.is_main else None
        shortfall = self.dist.broadcast(shortfall)
        if shortfall is not None:
            raise ResumeLogError(
                f"cannot resume from {path}: {shortfall}. Rows logged before the checkpoint are "
                "missing, so the resumed run's logs would disagree with its results. Restore "
                "the file(s), or start over with reliability.resume=false (or another "
                "hydra.run.dir)."
            )
        unwrap(self.model).load_state_dict(payload["model"])
        self.optimizer.load_state_dict(payload["optimizer"])
        ranks, old_world = payload["ranks"], int(payload["world_size"])
        self._restore_ranks(ranks, old_world)
        self.restored_totals = dict(payload.get("totals", {}))
        if self.dist.is_main:
            rewind_logs(self.output_dir, payload["logs"])
        state = TrainState.from_state_dict(payload["train_state"])
        _restore_loss_sums(state, ranks, self.dist)
        if old_world != self.dist.world_size:
            state.batch = reshard_batch(state.batch, old_world, self.dist.world_size)
        logger.info(
            "resuming from %s: epoch %d, batch %d, step %d",
            path,
            state.epoch,
            state.batch,
            state.step,
        )
        return state

    def _restore_ranks(self, ranks: list[dict[str, Any]], old_world: int) -> None:
        """This rank's RNG state, rank state, failure counts and rank totals from the
        checkpoint's per-rank entries (old rank ``rank % old_world_size``'s after a reshard;
        rank 0 then carries every old rank's counts)."""
        restore_rng_state(ranks[self.dist.rank % old_world]["rng"])
        self.restored_rank_state = dict(ranks[self.dist.rank % old_world].get("state", {}))
        if old_world == self.dist.world_size:
            self.monitor.load_state_dict(ranks[self.dist.rank]["failures"])
            self.restored_rank_totals = dict(ranks[self.dist.rank].get("totals", {}))
        elif self.dist.is_main:  # resharded: rank 0 carries every old rank's counts
            self.monitor.merge([rank["failures"] for rank in ranks])
            self.restored_rank_totals = _summed([rank.get("totals", {}) for rank in ranks])

    def _check_compatible(self, path: Path, payload: Mapping[str, Any]) -> None:
        differences = config_differences(payload["config"], self.config)
        if differences:
            raise ResumeConflictError(
                f"{path} was written by a run with a different config ({', '.join(differences)}"
                "); resuming would mix two experiments. Use another output directory "
                "(hydra.run.dir / hydra.sweep.dir), or reliability.resume=false to start over "
                "here."
            )
        if payload["world_size"] != self.dist.world_size:
            if self.cfg.reliability.world_size_change == "refuse":
                raise ResumeConflictError(
                    f"{path} was written by {payload['world_size']} processes, this run has "
                    f"{self.dist.world_size}; resume with the same --nproc_per_node (the data "
                    "order and the RNG states are per rank), or continue on the new process "
                    "count with reliability.world_size_change=reshard (not bit-identical)."
                )
            logger.warning(
                "%s was written by %d processes, this run has %d: resharding the remaining "
                "batches (reliability.world_size_change=reshard); the run continues but is not "
                "bit-identical to one on a fixed process count",
                path,
                payload["world_size"],
                self.dist.world_size,
            )
        saved, now = payload.get("threads"), torch.get_num_threads()
        if saved is not None and saved != now:
            message = (
                f"{path} was written with {saved} CPU thread(s) (torch.get_num_threads()), this "
                f"run has {now}: the float reduction order, hence the weights, would differ from "
                "an uninterrupted run"
            )
            if self.cfg.reliability.threads_change == "refuse":
                raise ResumeConflictError(
                    f"{message}. Resume with threads={saved}, or accept the difference with "
                    "reliability.threads_change=warn."
                )
            logger.warning("%s (reliability.threads_change=warn: continuing)", message)


class ResumeLogError(RuntimeError):
    """A metric file of the job holds fewer rows than its checkpoint recorded (cut, deleted, a
    CSV without its header): the resume is refused, the files left as they are."""


def log_shortfall(
    directory: Path, rows: Mapping[str, int], headers: Mapping[str, list[str]]
) -> str | None:
    """What is missing from the job's metric files against a checkpoint's ``log_rows``
    (``rows``) and ``csv_headers`` (``headers``): "<file> has N of the M rows ..." for each
    file that is shorter or gone, "<file> does not start with its header ..." for a CSV whose
    first row does not begin with the recorded header (a header grows, never shrinks), or None
    when every file holds at least its recorded rows (rows after the checkpoint are cut by
    ``rewind_logs``)."""
    present, now = log_rows(directory), csv_headers(directory)
    short = [
        f"{name} has {present.get(name, 0)} of the {expected} rows the checkpoint recorded"
        + ("" if name in present else " (the file is gone)")
        for name, expected in sorted(rows.items())
        if present.get(name, 0) < expected
    ]
    short += [
        f"{name} does not start with its header {list(header)[:4]}... (first row "
        f"{now.get(name, [])[:4]}...)"
        for name, header in sorted(headers.items())
        if name in present and now.get(name, [])[: len(header)] != list(header)
    ]
    return "; ".join(short) or None


def csv_headers(directory: Path) -> dict[str, list[str]]:
    """The first row (header) of every CSV metric file, by path relative to ``directory``."""
    out = {}
    for path in _sink_files(directory):
        if path.suffix == ".csv":
            with path.open(newline="", encoding="utf-8") as fh:
                out[str(path.relative_to(directory))] = next(csv.reader(fh), [])
    return out


def finished_results(
    output_dir: Path, cfg: TrainConfig, dist: DistributedContext
) -> dict[str, Any] | None:
    """The results of the job in ``output_dir`` when it already finished with this config
    (``results.json`` says ok and the newest checkpoint is past the last epoch), else None
    (also with ``reliability.resume=false``). Needs no model or data, so a finished job of a
    sweep is skipped before they are built (collective: rank 0 reads, every rank gets it).

    A garbled ``results.json`` is moved aside as ``results.json.corrupt`` (an error log line
    names it) and the job counts as unfinished: it resumes from its newest good checkpoint, and
    the ``results.json`` it writes reports the whole run (a finished job's last checkpoint
    holds its counts and totals)."""
    done = None
    if cfg.reliability.resume and dist.is_main and (output_dir / RESULTS_FILE).exists():
        results = results_or_none(output_dir / RESULTS_FILE)
        store = CheckpointStore(output_dir / CHECKPOINT_DIR, keep=cfg.reliability.keep)
        ok = results is not None and results.get("status") == "ok"
        latest = latest_or_none(store) if ok else None
        if (
            latest is not None
            and latest[1]["train_state"]["epoch"] > cfg.epochs
            and not config_differences(latest[1]["config"], comparable_config(as_container(cfg)))
        ):
            done = results
    return dist.broadcast(done)


def results_or_none(path: Path) -> dict[str, Any] | None:
    """The job's ``results.json``, or None when it is garbled (then moved aside as
    ``results.json.corrupt`` with an error naming it)."""
    try:
        return read_results(path)
    except ResultsError as err:
        aside = path.with_name(path.name + ".corrupt")
        path.replace(aside)
        reason = err.__cause__ if err.__cause__ is not None else "not a results object"
        logger.error(
            "%s is damaged (%s): moved aside to %s; resuming from the job's checkpoints",
            path,
            reason,
            aside,
        )
        return None


def latest_or_none(store: CheckpointStore) -> tuple[Path, dict[str, Any]] | None:
    """``store.latest()``, or None when every checkpoint is bad (``latest`` has moved each
    aside as ``.corrupt``; the error names them): the job starts from scratch."""
    try:
        return store.latest()
    except CheckpointError:
        logger.error(
            "every checkpoint in %s is bad (each moved aside as .corrupt, named above): "
            "starting from scratch",
            store.directory,
        )
        return None


def truncate_logs(directory: Path) -> None:
    """Remove the metric files of an earlier attempt (``metrics.jsonl`` / ``metrics.csv`` /
    ``tables/*``) before a job starts from scratch in ``directory``, with a warning naming
    them, so that no row is logged twice."""
    stale = _sink_files(directory)
    if stale:
        logger.warning(
            "starting from scratch in %s: removing the metric files of an earlier attempt (%s)",
            directory,
            ", ".join(str(p.relative_to(directory)) for p in stale),
        )
        rewind_logs(directory, {})


def _restore_loss_sums(
    state: TrainState, ranks: list[Mapping[str, Any]], dist: DistributedContext
) -> None:
    """Give each rank its own partial sums of the epoch's training loss (``loss_sum``,
    ``loss_count``, summed over ranks at the epoch's end), as it saved them, so a resumed run
    logs the same ``train/loss`` as an uninterrupted one. After a reshard rank 0 takes every
    old rank's sums, the others none. A checkpoint written before the per-rank sums were saved
    keeps ``train_state``'s (rank 0's) on every rank, as it was read then."""
    if any("loss" not in rank for rank in ranks):
        return
    if len(ranks) == dist.world_size:
        state.loss_sum, state.loss_count = ranks[dist.rank]["loss"]
        return
    mine = ranks if dist.is_main else []
    state.loss_sum = sum((float(rank["loss"][0]) for rank in mine), 0.0)
    state.loss_count = sum(int(rank["loss"][1]) for rank in mine)


def _summed(totals: list[Mapping[str, Any]]) -> dict[str, Any]:
    """``{key: {source: {kind: n}}}`` counts of several ranks added up (``events_summary``'s
    ``by_source`` of each key)."""
    keys = dict.fromkeys(key for total in totals for key in total)
    return {key: events_summary(t.get(key, {}) for t in totals)["by_source"] for key in keys}


def reshard_batch(batch: int, old_world_size: int, new_world_size: int) -> int:
    """The batch index on ``new_world_size`` ranks that resumes after ``batch`` global batches
    of ``old_world_size`` ranks (same per-rank batch size): the samples consumed so far,
    rounded down to whole new global batches (a few samples may be seen twice, none skipped)."""
    return batch * old_world_size // new_world_size


def _sink_files(directory: Path) -> list[Path]:
    """The metric files the file sinks write in a job directory."""
    files = [directory / "metrics.jsonl", directory / "metrics.csv"]
    tables = directory / "tables"
    if tables.is_dir():
        files += sorted(p for p in tables.iterdir() if p.suffix in (".jsonl", ".csv"))
    return [p for p in files if p.is_file()]


def log_rows(directory: Path) -> dict[str, int]:
    """Rows (JSON lines, or CSV data rows) of every metric file, by path relative to
    ``directory``."""
    out = {}
    for path in _sink_files(directory):
        with path.open(newline="", encoding="utf-8") as fh:
            if path.suffix == ".csv":
                rows = max(sum(1 for _ in csv.reader(fh)) - 1, 0)
            else:
                rows = sum(1 for line in fh if line.strip())
        out[str(path.relative_to(directory))] = rows
    return out


def rewind_logs(directory: Path, rows: Mapping[str, int]) -> None:
    """Cut every metric file back to ``rows`` (from ``log_rows``); files created later are
    removed."""
    for path in _sink_files(directory):
        keep = rows.get(str(path.relative_to(directory)))
        if keep is None:
            path.unlink()
            continue
        tmp = path.with_suffix(path.suffix + ".tmp")
        if path.suffix == ".csv":
            with path.open(newline="", encoding="utf-8") as fh:
                table = list(csv.reader(fh))[: keep + 1]
            with tmp.open("w", newline="", encoding="utf-8") as fh:
                csv.writer(fh).writerows(table)
        else:
            lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
            tmp.write_text("".join(line + "\n" for line in lines[:keep]), encoding="utf-8")
        tmp.replace(path)
