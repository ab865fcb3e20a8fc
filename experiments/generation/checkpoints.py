"""Checkpoint and resume of an ``experiments.generate`` job, with the machinery of
``experiments.engine.resume``: a ``CheckpointStore`` (atomic, checksummed, newest good file),
``comparable_config`` / ``config_differences`` (a directory of another run is refused), the RNG
states, failure counts and metric-file rows (cut back on resume, so no row appears twice).

Damage is handled as in a training job: a bad checkpoint is named in an error line, moved aside
as ``.corrupt`` and the previous one used; when every checkpoint is bad the job starts from
scratch in the same run; a job starting from scratch removes an earlier attempt's metric files;
a garbled ``results.json`` is moved aside as ``results.json.corrupt`` and the job resumes.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from experiments.config.typed import as_container
from experiments.engine.checkpoint import CheckpointStore
from experiments.engine.results import RESULTS_FILE
from experiments.engine.resume import (
    CHECKPOINT_DIR,
    ResumeConflictError,
    comparable_config,
    config_differences,
    latest_or_none,
    log_rows,
    results_or_none,
    rewind_logs,
    truncate_logs,
)
from experiments.generation.config import GenerateConfig
from experiments.generation.trainer import GanTraining
from implicit_ham.reliability.failures import FailureMonitor
from implicit_ham.reliability.rng import capture_rng_state, restore_rng_state

logger = logging.getLogger(__name__)


class GanCheckpoints:
    """Saves and restores a ``GanTraining`` with everything else a resumed run needs.

    Args:
        output_dir: the job directory. cfg: the typed config (``reliability.keep`` and
            ``reliability.resume`` are read; its ``comparable_config`` is stored and compared).
            training: what is saved. monitor: the failure monitor whose counts are saved.
    """

    def __init__(
        self,
        output_dir: Path,
        cfg: GenerateConfig,
        training: GanTraining,
        monitor: FailureMonitor,
    ) -> None:
        self.output_dir, self.cfg, self.training, self.monitor = output_dir, cfg, training, monitor
        self.config = comparable_config(as_container(cfg))
        self.store = CheckpointStore(output_dir / CHECKPOINT_DIR, keep=cfg.reliability.keep)
        self.resume = cfg.reliability.resume

    def save(self, extra: dict[str, Any]) -> None:
        """Checkpoint the current step (``extra``: e.g. the accumulated training time)."""
        payload = {
            "config": self.config,
            "training": self.training.state_dict(),
            "rng": capture_rng_state(),
            "failures": self.monitor.state_dict(),
            "logs": log_rows(self.output_dir),
            "extra": extra,
        }
        self.store.save(self.training.step, payload)

    def finished_results(self) -> dict[str, Any] | None:
        """The job's results when it already finished with this config, else None (a garbled
        ``results.json`` is moved aside, ``experiments.engine.resume.results_or_none``)."""
        if not self.resume or not (self.output_dir / RESULTS_FILE).exists():
            return None
        results = results_or_none(self.output_dir / RESULTS_FILE)
        ok = results is not None and results.get("status") == "ok"
        latest = latest_or_none(self.store) if ok else None
        if (
            latest is not None
            and latest[1]["training"]["step"] >= self.cfg.steps
            and not config_differences(latest[1]["config"], self.config)
        ):
            return results
        return None

    def restore(self) -> dict[str, Any] | None:
        """Load the newest good checkpoint (networks, optimisers, EMA, RNGs, failure counts;
        metric files cut back) and return its ``extra``; None when starting from scratch: no
        checkpoint, ``reliability.resume=false`` (deletes old checkpoints) or every checkpoint
        bad (each moved aside as ``.corrupt``, named in an error line); an earlier attempt's
        metric files are then removed (``truncate_logs``)."""
        if not self.resume:
            self.store.clear()
        latest = latest_or_none(self.store) if self.resume else None
        if latest is None:
            truncate_logs(self.output_dir)
            return None
        path, payload = latest
        differences = config_differences(payload["config"], self.config)
        if differences:
            raise ResumeConflictError(
                f"{path} was written by a run with a different config ({', '.join(differences)}"
                "); resuming would mix two experiments. Use another output directory "
                "(hydra.run.dir / hydra.sweep.dir), or reliability.resume=false to start over."
            )
        self.training.load_state_dict(payload["training"])
        restore_rng_state(payload["rng"])
        self.monitor.load_state_dict(payload["failures"])
        rewind_logs(self.output_dir, payload["logs"])
        logger.info("resuming from %s: step %d", path, self.training.step)
        return dict(payload["extra"])
