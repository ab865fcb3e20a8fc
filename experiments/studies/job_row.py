"""One study job's row: its typed config composed from the project's Hydra configs, and its
work measured (status, error, start / end time, peak memory) into the row the study's CSV
stores. Shared by the studies that write one CSV row per job (study v4, the sequence
benchmarks, generation v3)."""

from __future__ import annotations

import logging
import resource
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from hydra import compose, initialize_config_dir

from experiments.config.groups import TrainConfig, register_configs
from experiments.config.typed import typed_config
from experiments.studies.csv_rows import encode_curve

logger = logging.getLogger(__name__)

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"


def compose_overrides(overrides: Sequence[str]) -> TrainConfig:
    """The typed config of ``conf/config.yaml`` with ``overrides``."""
    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=list(overrides))
    return typed_config(cfg, TrainConfig)


def reset_peak_memory() -> bool:
    """Reset this process's peak RSS (Linux ``clear_refs``); False where that is unavailable."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def peak_memory_mb(reset: bool) -> float:
    """Peak RSS of this process since the reset (else since it started), MiB."""
    if reset:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measured_row(
    row: dict[str, Any], job_key: str, work: Callable[[], dict[str, Any]]
) -> dict[str, Any]:
    """``row`` updated with ``work()``'s result (curves encoded) and ``status: ok``, or, when
    it raises, ``status: failed`` and the error (the study goes on; a resumed study retries
    it); plus start / end time, peak memory and the threads it ran on. Runs on one thread."""
    torch.set_num_threads(1)
    reset = reset_peak_memory()
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
    row.update(started=started, finished=time.time(), peak_mem_mb=peak_memory_mb(reset))
    row["threads"] = torch.get_num_threads()  # as the job ran (``provenance``'s column)
    return row
