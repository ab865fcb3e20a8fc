"""Paths that a config makes a job write: they must stay under the run or a declared cache dir.

A config (a lab-mate's preset, a downloaded sweep) can name a file the job writes, e.g. the
generation metrics' classifier cache ``metrics.classifier_cache``. Unchecked, ``/home/x/.bashrc``
would be overwritten by a checkpoint. ``check_write_paths`` resolves every such path (symbolic
links included; a relative path is relative to the job directory) and refuses, with
``UnsafePathError``, one outside the allowed roots:

* the job directory and the folder that holds it (a sweep's directory: shared artefacts such as
  the classifier cache live there, beside the job directories);
* the declared cache directory, ``$IMPLICIT_HAM_CACHE_DIR``, when set (a cache shared by several
  sweeps).

Paths a job only reads (data roots, ``checkpoint=``, ``model.pretrained``) are not restricted:
checkpoints are read with ``weights_only=True``, which runs no code.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

CACHE_DIR_ENV = "IMPLICIT_HAM_CACHE_DIR"
WRITE_PATH_KEYS = ("metrics.classifier_cache",)


class UnsafePathError(ValueError):
    """A config names a file to write outside the job's directories (the message names the key,
    the path and the allowed roots)."""


def allowed_roots(job_dir: str | Path) -> list[Path]:
    """Where a job may write: its directory, the folder holding it, ``$IMPLICIT_HAM_CACHE_DIR``."""
    job = Path(job_dir).resolve()
    roots = [job, job.parent]
    declared = os.environ.get(CACHE_DIR_ENV)
    if declared:
        roots.append(Path(declared).expanduser().resolve())
    return roots


def _lookup(config: Mapping[str, Any], key: str) -> Any:
    node: Any = config
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def resolve_write_path(value: str | Path, job_dir: str | Path) -> Path:
    """Where a config's written path ``value`` points: ``~`` expanded, a relative path taken
    from the job directory (not the working directory), symbolic links followed. The check
    and the job that writes the file both use it, so the file checked is the file written."""
    return (Path(job_dir) / Path(str(value)).expanduser()).resolve()


def check_write_paths(
    config: Mapping[str, Any], job_dir: str | Path, keys: Sequence[str] = WRITE_PATH_KEYS
) -> None:
    """Refuse a written path of ``config`` (plain data) outside ``allowed_roots(job_dir)``.

    Args:
        config: the run's config as plain data (``experiments.config.typed.as_container``).
        job_dir: the job's directory (relative paths are resolved against it).
        keys: the dotted keys whose values are files the job writes (unset ones are skipped).

    Raises:
        UnsafePathError: naming the key, the resolved path and the allowed roots.
    """
    roots = allowed_roots(job_dir)
    for key in keys:
        value = _lookup(config, key)
        if value is None:
            continue
        path = resolve_write_path(value, job_dir)
        if not any(path == root or root in path.parents for root in roots):
            raise UnsafePathError(
                f"config {key}={value!r} resolves to {path}, outside the job's directories "
                f"({', '.join(str(r) for r in roots)}); a config may only make a job write "
                f"under its run directory or a declared cache directory. Leave {key} unset (the "
                f"default lives beside the job directories), or set {CACHE_DIR_ENV} to the "
                "folder that holds the cache."
            )
