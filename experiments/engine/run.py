"""``run_training``: the whole training job of ``experiments.train``, from a resolved config.

The job's steps, in reading order (``_train``): check the config (``check_training``), take the
job directory's lock, build the data, model, optimiser, sinks and checkpoints (``_build``),
restore the newest checkpoint (``_restore``), build the guarded optimisation step with its hooks
(``_guarded_step``), train (``_fit``: a ``Trainer`` with its callbacks) and write the results
(``_results``).

Reliability (``cfg.reliability``, a ``ReliabilityConf``): failures of implicit layers are
handled by ``on_failure`` and counted; checkpoints go to ``output_dir/checkpoints`` every
``checkpoint_every`` steps and at every epoch end; a job started again in the same directory
resumes from its newest good checkpoint (or returns its results when it had finished, before its
data and model are built). Under torchrun the job trains data-parallel and only rank 0 logs and
writes files; a collective that waits more than ``reliability.dist_timeout_s`` for a hung peer
raises ``DistributedTimeoutError`` naming the ranks that did not answer.

One writer: the job directory's lock (``experiments.engine.joblock``) is held while the job
runs; ``JobLockedError`` (naming the holder) when another live process holds it. Only while it
holds the lock does the job write into its directory: an error then writes ``results.json``
``status: "failed"`` (``experiments.engine.command.failures_recorded``); a command refused before
(a value, a held lock) leaves every file of the directory byte-identical.

Preemption: the signals of ``reliability.preempt_signals`` stop the run after the current step
with a checkpoint and ``results.json`` ``status: "preempted"``, then ``PreemptedError`` is raised
(``experiments.train`` exits with its ``exit_code``, 128 + signal number). Under submitit its
preemption signal is handled too, and the job is requeued through its ``checkpoint()`` hook
instead (``experiments.engine.submitit_requeue``).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from hydra.utils import instantiate
from torch import nn

from experiments.config.groups import (
    DiagnosticsConf,
    TrainConfig,
    check_components,
    check_train_config,
)
from experiments.config.typed import as_container
from experiments.data.factory import TaskInfo
from experiments.engine.build import (
    build_context,
    build_datasets,
    build_loaders,
    build_model,
    build_optimizer,
    build_sinks,
    context_channels,
)
from experiments.engine.callbacks import (
    Checkpointing,
    FlushAfterStep,
    SkipLimits,
    standard_callbacks,
)
from experiments.engine.checkpoint import write_checkpoint
from experiments.engine.clipping import clip_grad_hooks
from experiments.engine.command import failures_recorded
from experiments.engine.determinism import configure_determinism
from experiments.engine.distributed import DistributedContext, state_digest
from experiments.engine.failure_log import RankFailureLog
from experiments.engine.job_record import write_job_record
from experiments.engine.joblock import JobLock, JobLockedError
from experiments.engine.log_record import log_record
from experiments.engine.preemption import (
    PreemptedError,
    PreemptionGuard,
    preempted_results,
    preemptible,
)
from experiments.engine.provenance import host
from experiments.engine.results import write_results
from experiments.engine.resume import CheckpointExtras, JobCheckpoints, finished_results
from experiments.engine.run_checks import check_run_settings
from experiments.engine.run_events import RunEvents, events_summary
from experiments.engine.schedule import poly_lr_hooks
from experiments.engine.state import TrainState
from experiments.engine.targets import check_targets
from experiments.engine.task import Task
from experiments.engine.trainer import Trainer
from implicit_ham.adjoints.layers import find_implicit_layers
from implicit_ham.diagnostics import DiagnosticsCallback, Sink
from implicit_ham.plugins import check_choice
from implicit_ham.reliability.divergence import LossDivergence
from implicit_ham.reliability.failures import FailureMonitor
from implicit_ham.reliability.guard import GuardedStep, StepHooks, unwrap

logger = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "float64": torch.float64}


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (CPU and any accelerator)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def check_training(cfg: TrainConfig) -> None:
    """Every check of a training config, before anything is instantiated or written:
    ``check_train_config``, ``check_run_settings``, every ``_target_`` against
    ``experiments.engine.targets``'s allowlist (``UnsafeTargetError``), the library's checks of
    solver, adjoint and context (``check_components``) and ``dtype``."""
    check_train_config(cfg)
    check_run_settings(cfg)
    check_targets(as_container(cfg))  # before anything is instantiated
    check_components(cfg)  # the library's checks of solver, adjoint, context: before the data
    check_choice("config", "dtype", cfg.dtype, tuple(DTYPES))


def run_training(
    cfg: TrainConfig, output_dir: str | Path, job_files: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Train and evaluate the configured model; write ``results.json`` and ``checkpoint.pt``
    (the module docstring says how a job checkpoints, resumes, is preempted and fails).

    Args:
        cfg: the typed config (``experiments.config.typed.typed_config(cfg, TrainConfig)`` of
            the composed one, or a ``TrainConfig`` built by hand); checked first
            (``check_training``), before anything is written.
        output_dir: the job's directory.
        job_files: files the job writes (rank 0) into its directory once it holds the lock and
            its checkpoints (or finished results) match the config: the command's record of
            itself, ``experiments.engine.job_record.hydra_record`` ({relative path: text}).

    Returns:
        The results: ``config`` (as plain data), final ``metrics``, ``best`` validation loss,
        ``failures`` (counts), ``parameters``, ``train_time_s`` (of the whole run, resumed
        segments included), ``world_size``, ``state_digests`` (SHA-256 of the model state on
        each rank: all equal when the replicas are in sync), the last forward solve statistics
        of each implicit layer (``solver``), ``threads`` (``torch.get_num_threads()``), ``host``
        (processor, library commit and torch version at the job's end:
        ``experiments.engine.provenance.host``) and ``events``: the library's warning events of
        the run
        (``experiments.engine.run_events.events_summary``); rank 0's also ``logs``, the metric
        files it belongs to (``experiments.engine.log_record``).
    """
    check_training(cfg)
    with preemptible(cfg.reliability.preempt_signals) as guard:
        dist = DistributedContext.from_env(cfg.device, cfg.reliability.dist_timeout_s)
        with dist.diagnose_hangs():
            job_dir = Path(dist.broadcast(str(output_dir)))
            with (
                _job_lock(job_dir, dist),
                failures_recorded(
                    job_dir,
                    as_container(cfg),
                    logger_target=cfg.logger._target_,
                    write=dist.is_main,
                ),
                dist.diagnose_hangs(),  # a hang is named before the failure is recorded
            ):
                results = _train(cfg, job_dir, dist, guard, dict(job_files or {}))
            dist.close()
    return results


@contextmanager
def _job_lock(job_dir: Path, dist: DistributedContext) -> Iterator[None]:
    """Hold the job directory's ``JobLock`` (rank 0 takes it; every rank raises
    ``JobLockedError`` when it is held by another run)."""
    lock = JobLock(job_dir) if dist.is_main else None
    error = None
    if lock is not None:
        try:
            lock.acquire()
        except JobLockedError as err:
            error = str(err)
    error = dist.broadcast(error)
    if error is not None:
        raise JobLockedError(error)
    try:
        yield
    finally:
        if lock is not None:
            lock.release()


@dataclass
class _Job:
    """The parts of one training job, built once (``_build``) in a fixed order (the order of
    the random draws)."""

    cfg: TrainConfig
    output_dir: Path
    dist: DistributedContext
    info: TaskInfo
    loaders: tuple[Any, Any]
    model: nn.Module
    optimizer: torch.optim.Optimizer
    sinks: list[Sink]
    monitor: FailureMonitor
    failure_log: RankFailureLog
    run_events: RunEvents
    divergence: LossDivergence | None
    checkpoints: JobCheckpoints
    clock: _Clock


class _Step(NamedTuple):
    """The guarded optimisation step of a job, its task and its diagnostics callback."""

    run: GuardedStep
    task: Task
    diagnostics: DiagnosticsCallback | None


def _train(
    cfg: TrainConfig,
    output_dir: Path,
    dist: DistributedContext,
    guard: PreemptionGuard,
    job_files: dict[str, str],
) -> dict[str, Any]:
    """The job under its lock: set up the process, build, restore, train, write the results."""
    _set_up_process(cfg, output_dir, dist)
    finished = finished_results(output_dir, cfg, dist)
    if finished is not None:  # before any data or model is built
        logger.info("%s finished earlier with this config; not retrained", output_dir)
        if dist.is_main:
            write_job_record(output_dir, job_files)
        return finished
    job = _build(cfg, output_dir, dist)
    state = _restore(job, job_files)
    step = _guarded_step(job, None if state is None else state.step)
    state = state or TrainState()
    metrics = _fit(job, step, state, guard)
    return _results(job, metrics, state)


def _set_up_process(cfg: TrainConfig, output_dir: Path, dist: DistributedContext) -> None:
    """The job directory, threads, log level of the other ranks, determinism and seeds."""
    output_dir.mkdir(parents=True, exist_ok=True)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    if not dist.is_main:
        logging.getLogger().setLevel(logging.WARNING)
    configure_determinism(cfg.reliability.deterministic, dist.device)
    seed_everything(cfg.seed)


def _build(cfg: TrainConfig, output_dir: Path, dist: DistributedContext) -> _Job:
    """Data, model (wrapped for data parallelism), optimiser, sinks, the failure monitor and
    the checkpoints, in this order."""
    reliability = cfg.reliability
    train_set, val_set, info = build_datasets(cfg.data)
    loaders = build_loaders(
        train_set, val_set, cfg.batch_size, cfg.seed, rank=dist.rank, world_size=dist.world_size
    )
    solver, adjoint = instantiate(cfg.solver), instantiate(cfg.adjoint)
    context = build_context(cfg.context, context_channels(info, cfg.model), solver, adjoint)
    model = build_model(info, context, cfg.model, solver, adjoint)
    model = model.to(device=dist.device, dtype=DTYPES[cfg.dtype])
    optimizer = build_optimizer(cfg.optim, model, cfg.model.backbone_lr_scale)
    model = dist.wrap(model)
    sinks = build_sinks(cfg.logger, output_dir, as_container(cfg)) if dist.is_main else []
    clock = _Clock()
    divergence = (
        LossDivergence(reliability.divergence_factor, reliability.divergence_steps)
        if reliability.divergence_steps
        else None
    )
    run_events = RunEvents(unwrap(model))
    failure_log = RankFailureLog(sinks, dist)  # every rank's events, written by rank 0
    monitor = FailureMonitor(
        [failure_log], warn_first=reliability.warn_first, warn_every=reliability.warn_every
    )
    extras = CheckpointExtras(
        totals=lambda: {
            "train_time_s": clock.elapsed(),
            "solver": _solver_summaries(unwrap(model)),
        },
        rank_totals=lambda: {"events": run_events.counts()},
        rank_state=lambda: {} if divergence is None else {"divergence": divergence.state_dict()},
    )
    checkpoints = JobCheckpoints(
        output_dir, cfg, model=model, optimizer=optimizer, monitor=monitor, dist=dist, extras=extras
    )
    return _Job(
        cfg, output_dir, dist, info, loaders, model, optimizer, sinks, monitor, failure_log,
        run_events, divergence, checkpoints, clock,
    )  # fmt: skip


def _restore(job: _Job, job_files: dict[str, str]) -> TrainState | None:
    """The newest good checkpoint into the job (None: a fresh start); then the job's record."""
    state = job.checkpoints.restore()
    restored = job.checkpoints.restored_rank_state
    if job.divergence is not None and "divergence" in restored:
        job.divergence.load_state_dict(restored["divergence"])
    if job.dist.is_main:  # the checkpoints matched this config: the job's record is this command's
        write_job_record(job.output_dir, job_files)
    job.run_events.restore(job.checkpoints.restored_rank_totals.get("events") or {})
    return state


def _guarded_step(job: _Job, resumed_at: int | None) -> _Step:
    """The step hooks (diagnostics, polynomial learning rate, gradient clipping), the task
    (with its penalty) and the ``GuardedStep`` under the failure policy; ``resumed_at``: the
    step a resumed run continues from (None: a fresh start)."""
    cfg, model = job.cfg, unwrap(job.model)
    hooks, diagnostics = _diagnostics(cfg.diagnostics, model, job.sinks, job.optimizer)
    if cfg.lr_poly_power is not None:
        total = cfg.epochs * len(job.loaders[0])
        hooks = poly_lr_hooks(hooks, job.optimizer, total, cfg.lr_poly_power)
    if cfg.clip_grad_norm is not None:
        hooks = clip_grad_hooks(hooks, model, cfg.clip_grad_norm)
    if diagnostics is not None and resumed_at is not None:
        diagnostics.close()
        diagnostics.prepare(resumed_at)
    penalty = None if cfg.penalty is None else instantiate(cfg.penalty).attach(model)
    info = job.info
    ignore_index = info.ignore_index if info.ignore_index is not None else -100
    task = Task(info.kind, info.num_classes, ignore_index, penalty=penalty, loss_fn=info.loss)
    run = GuardedStep(
        job.model,
        task,
        job.optimizer,
        policy=cfg.reliability.on_failure,
        monitor=job.monitor,
        hooks=hooks,
        dist=job.dist,
        divergence=job.divergence,
    )
    return _Step(run, task, diagnostics)


def _fit(job: _Job, step: _Step, state: TrainState, guard: PreemptionGuard) -> dict[str, float]:
    """Train from ``state`` with the job's callbacks; a preempted run writes its results
    (``status: "preempted"``) and raises ``PreemptedError``."""
    cfg, dist = job.cfg, job.dist
    checkpointing = Checkpointing(job.checkpoints.save, cfg.reliability.checkpoint_every)
    callbacks = standard_callbacks(
        sinks=job.sinks,
        log_every=cfg.log_every,
        checkpoint=checkpointing,
        preempt=lambda: guard.signum,
        skip_limits=SkipLimits(cfg.reliability.max_consecutive_skips, cfg.reliability.max_skips),
        stop_at_accuracy=cfg.stop_at_accuracy,
        progress=cfg.progress and dist.is_main,
    )
    callbacks.insert(0, FlushAfterStep(job.failure_log.flush))  # every rank's failure rows first
    trainer = Trainer(
        job.model, step.task, step.run, device=dist.device, dtype=DTYPES[cfg.dtype], dist=dist,
        callbacks=callbacks,
    )  # fmt: skip
    job.clock.start(float(job.checkpoints.restored_totals.get("train_time_s", 0.0)))
    try:
        return trainer.fit(*job.loaders, cfg.epochs, state)
    except PreemptedError as stopped:  # every rank stops at the same step
        failures = _failure_counts(job.monitor, dist, state.skipped)
        if dist.is_main:
            write_results(job.output_dir, preempted_results(stopped, as_container(cfg), failures))
        logger.warning("%s; checkpoint written, run the same command to resume", stopped)
        raise
    finally:
        step.run.close()
        job.run_events.close()
        if step.diagnostics is not None:
            step.diagnostics.close()
        for sink in job.sinks:
            sink.close()


def _results(job: _Job, metrics: dict[str, float], state: TrainState) -> dict[str, Any]:
    """The finished job's results (collective); rank 0 writes ``checkpoint.pt`` (the final
    model and optimiser) and ``results.json``."""
    dist, model, config = job.dist, unwrap(job.model), as_container(job.cfg)
    results = {
        "status": "ok",
        "config": config,
        "metrics": metrics,
        "best": state.best,
        "failures": _failure_counts(job.monitor, dist, state.skipped),
        "parameters": sum(p.numel() for p in job.model.parameters() if p.requires_grad),
        "train_time_s": job.clock.elapsed(),
        "world_size": dist.world_size,
        "state_digests": dist.gather(state_digest(model)),
        "solver": _solver_summaries(model) or job.checkpoints.restored_totals.get("solver", {}),
        "threads": torch.get_num_threads(),
        "host": host(),
        "events": events_summary(dist.gather(job.run_events.counts())),
    }
    logger.info("failures: %s", results["failures"])
    if dist.is_main:
        final = {"model": model.state_dict(), "optimizer": job.optimizer.state_dict()}
        write_checkpoint(job.output_dir / "checkpoint.pt", {**final, "config": config})
        results["logs"] = log_record(job.output_dir)  # the rows these results belong to
        write_results(job.output_dir, results)
    return results


def _failure_counts(
    monitor: FailureMonitor, dist: DistributedContext, skipped: int
) -> dict[str, Any]:
    """Every rank's failure counts summed (``FailureMonitor.summary``) with the batches the
    policy skipped (collective)."""
    total = FailureMonitor()
    total.merge(dist.gather(monitor.state_dict()))
    return {**total.summary(), "skipped_batches": skipped}


class _Clock:
    """Train time of the whole run: earlier segments (from the checkpoint) plus this one."""

    def __init__(self) -> None:
        self.before = 0.0
        self.since: float | None = None

    def start(self, before: float) -> None:
        self.before, self.since = before, time.perf_counter()

    def elapsed(self) -> float:
        return self.before + (0.0 if self.since is None else time.perf_counter() - self.since)


def _diagnostics(
    diag: DiagnosticsConf, model: nn.Module, sinks: list[Sink], optimizer: torch.optim.Optimizer
) -> tuple[StepHooks, DiagnosticsCallback | None]:
    if not diag.enabled or not sinks:
        return StepHooks(), None
    callback = DiagnosticsCallback(
        model,
        sinks,
        every=diag.every,
        optimizer=optimizer,
        layer_hooks=diag.layer_hooks,
        conditioning_every=diag.conditioning_every,
    )
    return StepHooks(after_backward=callback.on_backward), callback


def _solver_summaries(model: nn.Module) -> dict[str, Any]:
    layers = find_implicit_layers(model).items()
    solutions = {name: getattr(layer, "last_solution", None) for name, layer in layers}
    return {name: s.stats.summary() for name, s in solutions.items() if s is not None}
