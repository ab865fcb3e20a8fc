"""``run_generation``: one GAN job of ``experiments.generate``, from its typed config.

Writes into the job directory: ``metrics.jsonl`` / ``metrics.csv`` (losses and context gates
every ``log_every`` steps, ``eval/*`` metrics every ``metrics.eval_every`` steps: the training
curves), ``samples.png`` (a grid of EMA-generator samples), ``checkpoint.pt`` (the final
networks) and ``results.json`` (final metrics of the EMA generator, the real data's reference
values, the classifier's held-out accuracy, failure counts, parameter counts, times).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from hydra.utils import instantiate

from experiments.config.typed import as_container
from experiments.data.twin_digits import TwinDigitsDataset
from experiments.engine.build import build_context, build_sinks
from experiments.engine.checkpoint import write_checkpoint
from experiments.engine.command import failures_recorded
from experiments.engine.determinism import configure_determinism
from experiments.engine.failure_log import failure_summary, logged_failure_rows
from experiments.engine.job_record import write_job_record
from experiments.engine.joblock import JobLock
from experiments.engine.paths import resolve_write_path
from experiments.engine.preemption import (
    PreemptedError,
    PreemptionGuard,
    preempted_results,
    preemptible,
)
from experiments.engine.results import write_results
from experiments.engine.run import seed_everything
from experiments.engine.run_checks import check_reliability
from experiments.engine.targets import check_targets
from experiments.generation.checkpoints import GanCheckpoints
from experiments.generation.classifier import load_or_train_classifier
from experiments.generation.config import GenerateConfig, check_generate_config
from experiments.generation.evaluate import features_of, sample_canvases, save_grid, score
from experiments.generation.guard import network_of
from experiments.generation.trainer import GanTraining, StepBatches, canvases_of
from experiments.models.digit_classifier import CanvasFeatures
from experiments.models.gan import Discriminator, Generator, parameter_count
from implicit_ham.reliability.failures import FailureMonitor

logger = logging.getLogger(__name__)

CLASSIFIER_FILE = "classifier.pt"
SAMPLES_FILE = "samples.png"


def build_networks(cfg: GenerateConfig) -> tuple[Generator, Discriminator]:
    """Generator and discriminator with the configured context module at 16x16 in each."""
    solver, adjoint = instantiate(cfg.solver), instantiate(cfg.adjoint)
    gan = cfg.gan
    g_context = build_context(cfg.context, gan.g_width, solver, adjoint)
    d_context = build_context(cfg.context, gan.d_width, solver, adjoint)
    generator = Generator(g_context, z_dim=gan.z_dim, width=gan.g_width)
    return generator, Discriminator(d_context, width=gan.d_width)


def run_generation(
    cfg: GenerateConfig, output_dir: str | Path, job_files: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Train the configured GAN, evaluate its EMA generator, write the job's files (module
    docstring) and return the results. A job directory holding a finished run of this config
    returns its results without training; one holding checkpoints resumes from the newest.
    Values are checked before the job directory's lock is taken; only while holding it does
    the job write (a failure: ``results.json`` "failed", ``failures_recorded``).

    Args:
        cfg: the typed config (``experiments.config.typed.typed_config(cfg, GenerateConfig)``
            of the composed one, or a ``GenerateConfig`` built by hand).
        output_dir: the job's directory.
        job_files: the command's record of itself ({relative path: text},
            ``experiments.engine.job_record.hydra_record``), written once the job holds the
            lock and its checkpoints matched the config.
    """
    check_generate_config(cfg)
    check_reliability(cfg.reliability)  # every value before the lock: a refusal writes nothing
    check_targets(as_container(cfg))  # before anything is instantiated
    output_dir = Path(output_dir)
    record = dict(job_files or {})
    with (
        preemptible(cfg.reliability.preempt_signals) as guard,
        JobLock(output_dir),
        failures_recorded(
            output_dir,
            as_container(cfg),
            logger_target=cfg.logger._target_,
            failure_counts=logged_gan_failure_counts,
        ),
    ):
        return _run(cfg, output_dir, guard, record)


def _run(
    cfg: GenerateConfig, output_dir: Path, guard: PreemptionGuard, job_files: dict[str, str]
) -> dict[str, Any]:
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    device = torch.device(cfg.device)
    reliability, metrics_cfg, canvas = cfg.reliability, cfg.metrics, cfg.canvas
    configure_determinism(reliability.deterministic, device)
    seed_everything(cfg.seed)

    cache = (
        output_dir.parent / CLASSIFIER_FILE
        if not metrics_cfg.classifier_cache
        else resolve_write_path(metrics_cfg.classifier_cache, output_dir)  # as checked
    )
    classifier, accuracy = load_or_train_classifier(
        cache, metrics_cfg.classifier_epochs, canvas.val_fraction, canvas.seed
    )
    if accuracy < metrics_cfg.min_classifier_accuracy:
        raise RuntimeError(
            f"the metrics' digit classifier reached {accuracy:.4f} held-out accuracy, below "
            f"metrics.min_classifier_accuracy={metrics_cfg.min_classifier_accuracy}; train it "
            "longer (metrics.classifier_epochs) before trusting FID / consistency"
        )
    extractor = CanvasFeatures(classifier)
    fraction, seed = canvas.val_fraction, canvas.seed
    train_set = TwinDigitsDataset("train", canvas.train_size, val_fraction=fraction, seed=seed)
    real = TwinDigitsDataset("val", canvas.val_size, val_fraction=fraction, seed=seed).canvases
    real_features = features_of(extractor, real)

    generator, discriminator = build_networks(cfg)
    generator.to(device)
    discriminator.to(device)
    config = as_container(cfg)  # what the files record
    sinks = build_sinks(cfg.logger, output_dir, config)
    monitor = FailureMonitor(
        sinks, warn_first=reliability.warn_first, warn_every=reliability.warn_every
    )
    training = GanTraining(
        generator, discriminator, cfg.gan, policy=reliability.on_failure, monitor=monitor
    )
    checkpoints = GanCheckpoints(output_dir, cfg, training, monitor)
    finished = checkpoints.finished_results()
    if finished is not None:
        logger.info("%s finished earlier with this config; not retrained", output_dir)
        for sink in sinks:
            sink.close()
        write_job_record(output_dir, job_files)
        return finished
    extra = checkpoints.restore() or {"train_time_s": 0.0, "eval_time_s": 0.0}
    write_job_record(output_dir, job_files)  # the checkpoints matched this config
    scoring = {
        "knn_k": metrics_cfg.knn_k,
        "kid_subsets": metrics_cfg.kid_subsets,
        "kid_subset_size": metrics_cfg.kid_subset_size,
    }
    try:
        _train(cfg, training, checkpoints, sinks, extra, train_set, real_features, extractor,
               scoring, device, preempt=lambda: guard.signum)  # fmt: skip
    except PreemptedError as stopped:
        failures = _failure_counts(monitor, training)
        write_results(output_dir, preempted_results(stopped, config, failures))
        logger.warning("%s; checkpoint written, run the same command to resume", stopped)
        raise
    finally:
        for sink in sinks:
            sink.close()

    start = time.perf_counter()
    ema = training.ema_generator()
    samples = sample_canvases(ema, metrics_cfg.samples)
    final = score(samples, real_features, extractor, **scoring)
    reference_set = canvases_of(train_set)[: metrics_cfg.samples]
    reference = score((reference_set + 1) / 2, real_features, extractor, **scoring)
    save_grid(samples, output_dir / SAMPLES_FILE, columns=metrics_cfg.grid)
    extra["eval_time_s"] += time.perf_counter() - start
    results = {
        "status": "ok",
        "config": config,
        "metrics": final.as_dict(),
        "reference": {**reference.as_dict(), "note": "real training canvases vs the real set"},
        "classifier_accuracy": accuracy,
        "failures": _failure_counts(monitor, training),
        "parameters": {
            "G": parameter_count(generator),
            "D": parameter_count(discriminator),
            "G_context": parameter_count(generator.context),
            "D_context": parameter_count(discriminator.context),
        },
        "steps": training.step,
        "train_time_s": extra["train_time_s"],
        "eval_time_s": extra["eval_time_s"],
        "gates": training.gates(),
    }
    write_checkpoint(
        output_dir / "checkpoint.pt",
        {"G": generator.state_dict(), "D": discriminator.state_dict(), "G_ema": ema.state_dict()},
    )
    write_results(output_dir, results)
    logger.info("final metrics %s; failures %s", results["metrics"], results["failures"]["total"])
    return results


def _train(
    cfg: GenerateConfig,
    training: GanTraining,
    checkpoints: GanCheckpoints,
    sinks: list,
    extra: dict[str, Any],
    train_set: TwinDigitsDataset,
    real_features: torch.Tensor,
    extractor: CanvasFeatures,
    scoring: dict[str, int],
    device: torch.device,
    *,
    preempt: Callable[[], int | None],
) -> None:
    """Train up to ``cfg.steps``, logging, evaluating and checkpointing on the way; a
    preemption signal (``preempt()`` set, asked after every step but the last) checkpoints the
    step and raises ``PreemptedError``."""
    steps, log_every = cfg.steps, cfg.log_every
    every = cfg.reliability.checkpoint_every
    eval_every = cfg.metrics.eval_every
    curve_samples = cfg.metrics.curve_samples
    batches = StepBatches(canvases_of(train_set), cfg.batch_size, cfg.seed)
    stream = batches.from_step(training.step)
    while training.step < steps:
        start = time.perf_counter()
        losses = training.train_step(next(stream).to(device))
        extra["train_time_s"] += time.perf_counter() - start
        step = training.step
        if step % log_every == 0 or step == steps:
            row = {**losses, **training.gates(), "train_time_s": extra["train_time_s"]}
            for sink in sinks:
                sink.log(row, step)
        if eval_every and (step % eval_every == 0 or step == steps):
            start = time.perf_counter()
            samples = sample_canvases(training.ema_generator(), curve_samples)
            metrics = score(samples, real_features, extractor, **scoring)
            extra["eval_time_s"] += time.perf_counter() - start
            for sink in sinks:
                sink.log(metrics.as_dict("eval/"), step)
        signum = preempt() if step < steps else None  # after the last step: finish
        if signum is not None or (every and step % every == 0) or step == steps:
            checkpoints.save(extra)
        if signum is not None:
            raise PreemptedError(signum, step)


def _failure_counts(monitor: FailureMonitor, training: GanTraining) -> dict[str, Any]:
    """The ``failures`` of ``results.json``: the monitor's counts and the dropped updates."""
    return {**monitor.summary(), "skipped_updates": training.skipped}


def logged_gan_failure_counts(job_dir: str | Path) -> dict[str, Any]:
    """The ``failures`` of a failed job's ``results.json``, counted from its
    ``tables/failures.jsonl`` (``experiments.engine.failure_log``): the events' counts and the
    dropped updates per network (an event whose action is "skipped" drops one update)."""
    rows = logged_failure_rows(job_dir)
    dropped = Counter(network_of(row["layer"]) for row in rows if row["action"] == "skipped")
    return {**failure_summary(rows), "skipped_updates": {"D": dropped["D"], "G": dropped["G"]}}
