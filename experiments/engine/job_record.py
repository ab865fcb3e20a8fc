"""The job's record of the command that runs it: ``<job dir>/.hydra/`` (``config.yaml``,
``hydra.yaml``, ``overrides.yaml``, as Hydra writes them).

Hydra writes these files at job start, before the command has checked a single value or taken
the job directory's lock, so a refused command (a bad value, a job held by a live run, a config
that conflicts with the job's checkpoints) would relabel the job with settings it never
trained with. The commands therefore set ``hydra.output_subdir: null`` (``conf/config.yaml``):
Hydra writes nothing, ``hydra_record`` captures the same three files
at start-up and the engine writes them (``write_job_record``) once the job holds its lock and
the checkpoints it resumes from (or the finished results it returns) matched the config.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import cast

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

RECORD_DIR = ".hydra"


def hydra_record(task_cfg: DictConfig) -> dict[str, str]:
    """The files of ``.hydra/`` for the running Hydra job: {relative path: YAML text}
    (``task_cfg``: the config the task function received); {} outside a Hydra job."""
    if not HydraConfig.initialized():
        return {}
    hydra = cast(DictConfig, HydraConfig.instance().cfg)  # {"hydra": ...}, as Hydra saves it
    return {
        f"{RECORD_DIR}/config.yaml": OmegaConf.to_yaml(task_cfg),
        f"{RECORD_DIR}/hydra.yaml": OmegaConf.to_yaml(hydra),
        f"{RECORD_DIR}/overrides.yaml": OmegaConf.to_yaml(hydra.hydra.overrides.task),
    }


def write_job_record(directory: str | Path, files: Mapping[str, str]) -> None:
    """Write ``files`` ({path relative to ``directory``: text}) atomically (a temporary file
    renamed over each)."""
    for name, text in files.items():
        path = Path(directory) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
