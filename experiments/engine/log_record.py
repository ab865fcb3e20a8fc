"""Which logs a ``results.json`` belongs to: the job's metric files as they stood when it was
written, so that a reader can tell results from the rows beside them.

A finished job's ``results.json`` records ``logs``: the rows (``resume.log_rows``) and the
SHA-256 of every metric file (``metrics.jsonl`` / ``metrics.csv`` / ``tables/*``) at the time
it was written. A later run in the same directory that did not finish (e.g.
``reliability.resume=false`` with other settings, then killed) rewrites those files but not
``results.json``; ``logs_mismatch`` then names the files that changed, and the sweep report
lists the job as stale instead of ok.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from experiments.engine.resume import log_rows


def log_record(directory: str | Path) -> dict[str, Any]:
    """``{"rows": {file: rows}, "sha256": {file: digest}}`` of the job's metric files (paths
    relative to ``directory``)."""
    directory = Path(directory)
    rows = log_rows(directory)
    digests = {name: _sha256(directory / name) for name in rows}
    return {"rows": rows, "sha256": digests}


def logs_mismatch(directory: str | Path, record: Mapping[str, Any]) -> str | None:
    """None when the metric files of ``directory`` are those ``record`` (a ``log_record``)
    describes; else what differs (files added, removed, or with other rows / contents)."""
    now = log_record(directory)
    recorded = record.get("sha256") or {}
    rows = record.get("rows") or {}
    changed = []
    for name in sorted(set(recorded) | set(now["sha256"])):
        if name not in now["sha256"]:
            changed.append(f"{name} removed")
        elif name not in recorded:
            changed.append(f"{name} added ({now['rows'][name]} rows)")
        elif recorded[name] != now["sha256"][name]:
            changed.append(f"{name} rewritten ({now['rows'][name]} rows, {rows.get(name)} then)")
    return "; ".join(changed) or None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
