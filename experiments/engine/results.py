"""``results.json``: what every experiment job writes (its config, metrics and timings)."""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from experiments.engine.write_errors import writing

RESULTS_FILE = "results.json"


def write_results(directory: str | Path, results: Mapping[str, Any]) -> Path:
    """Write ``results`` to ``directory/results.json`` atomically (temporary file, rename).

    Non-finite floats are written as null so the file stays valid JSON; the file gets the mode
    the umask gives.
    """
    path = Path(directory) / RESULTS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    with (
        writing(path),
        tempfile.NamedTemporaryFile(
            "w",
            dir=path.parent,
            delete=False,
            prefix=f"{RESULTS_FILE}.{os.getpid()}.",
            suffix=".tmp",
        ) as fh,
    ):
        json.dump(_finite(results), fh, indent=2, sort_keys=True)
        tmp = fh.name
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(tmp, 0o666 & ~mask)  # the umask's mode, as open() gives, not tempfile's 0600
    os.replace(tmp, path)
    return path


class ResultsError(ValueError):
    """A ``results.json`` is not valid JSON or not an object (the message names the file)."""


def read_results(path: str | Path) -> dict[str, Any]:
    """Read one ``results.json`` (a path to the file or to its job directory).

    Raises ``ResultsError`` naming the file when it is garbled (not JSON, or not an object);
    a missing file raises ``FileNotFoundError`` as usual.
    """
    path = Path(path)
    if path.is_dir():
        path = path / RESULTS_FILE
    with path.open(encoding="utf-8") as fh:
        try:
            results = json.load(fh)
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise ResultsError(
                f"{path} is not valid JSON ({err}); the job's results file is damaged. Delete "
                "it and run the job's command again (it resumes from its checkpoint)."
            ) from err
    if not isinstance(results, dict):
        raise ResultsError(
            f"{path} holds a JSON {type(results).__name__}, not the results object of a job. "
            "Delete it and run the job's command again (it resumes from its checkpoint)."
        )
    return results


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value
