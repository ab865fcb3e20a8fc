"""A study's committed raw data: one CSV row per job, and a sessions sidecar.

A study's CSV (``docs/results/paper_v4.csv``, the sequence benchmarks', the DEQ study's) holds
one row per finished job (``COLUMNS``: the paper-regime studies' columns; a study passes its
own), rewritten atomically (a temporary file, then ``os.replace``) each time a job ends, so an
interrupted study leaves a valid file and a study resumed on a fresh machine skips every job
whose row says ``ok``. Lists (a val curve) are stored as ``;``-separated ``step:value`` pairs.
``<csv stem>.sessions.csv`` beside it records each invocation of the runner (start and end
time, jobs run, workers), from which a page states the sweep's measured wall time.
"""

from __future__ import annotations

import csv
import io
import math
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

COLUMNS = (
    "job", "study", "stage", "regime", "context", "gradient", "K", "inv_t", "lr", "replicate",
    "data_seed", "model_seed", "epochs", "steps", "status", "val_miou", "val_pixel_acc",
    "val_loss", "test_miou", "test_pixel_acc", "test_loss", "val_curve", "fidelity",
    "train_s", "peak_mem_mb", "started", "finished", "plan", "error",
)  # fmt: skip
# main_epochs: the main arms' training length of that invocation ("" in older rows: the default)
SESSION_COLUMNS = ("started", "finished", "jobs_run", "workers", "plan", "main_epochs")
FLOAT_COLUMNS = (
    "inv_t", "lr", "val_miou", "val_pixel_acc", "val_loss", "test_miou", "test_pixel_acc",
    "test_loss", "train_s", "peak_mem_mb", "started", "finished",
)  # fmt: skip
INT_COLUMNS = ("K", "replicate", "data_seed", "model_seed", "epochs", "steps", "threads",
               "jobs_run", "workers", "main_epochs")  # fmt: skip


def sessions_path(csv_path: str | Path) -> Path:
    """The sidecar of ``csv_path``: ``<stem>.sessions.csv`` in the same folder."""
    path = Path(csv_path)
    return path.with_name(f"{path.stem}.sessions.csv")


def _format(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return "nan" if math.isnan(value) else repr(value)
    return str(value)


def _write_atomic(path: Path, columns: Sequence[str], rows: Iterable[Mapping[str, Any]]) -> None:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(columns), lineterminator="\n")
    writer.writeheader()
    for row in rows:
        unknown = set(row) - set(columns)
        if unknown:
            raise ValueError(f"{path}: row has columns {sorted(unknown)} not in {list(columns)}")
        writer.writerow({c: _format(row.get(c)) for c in columns})
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(buffer.getvalue(), encoding="utf-8")
    os.replace(tmp, path)


def _parse(column: str, text: str) -> Any:
    if text == "":
        return None
    if column in FLOAT_COLUMNS:
        return float(text)
    if column in INT_COLUMNS:
        return int(text)
    return text


def write_rows(
    path: str | Path, rows: Mapping[str, Mapping[str, Any]], columns: Sequence[str] = COLUMNS
) -> None:
    """Rewrite the CSV with ``rows`` (job key -> row), sorted by stage order then key."""
    order = {"pretrain": 0, "tune": 1, "main": 2, "k_axis": 3}
    ordered = sorted(rows.values(), key=lambda r: (order.get(str(r.get("stage")), 9), r["job"]))
    _write_atomic(Path(path), columns, ordered)


def read_row_list(
    path: str | Path,
    columns: Sequence[str] = COLUMNS,
    parse: Callable[[str, str], Any] | None = None,
) -> list[dict[str, Any]]:
    """Every row of the CSV in file order, typed (a job may have several: re-runs); [] when
    the file does not exist. ``columns``: the study's columns; ``parse(column, text)``: the
    study's typing of a cell (default: this module's)."""
    path = Path(path)
    if not path.exists():
        return []
    with path.open(encoding="utf-8", newline="") as fh:
        reader = csv.DictReader(fh)
        missing = set(columns) - set(reader.fieldnames or ())
        if missing:
            raise ValueError(f"{path}: columns {sorted(missing)} missing; is it this study's CSV?")
        typed = parse or _parse
        return [{c: typed(c, row[c]) for c in columns} for row in reader]


def read_rows(path: str | Path, columns: Sequence[str] = COLUMNS) -> dict[str, dict[str, Any]]:
    """The CSV's rows (job key -> row with typed values); {} when the file does not exist.
    ``columns``: the study's columns (a study v4 CSV has provenance columns beyond v3's)."""
    return {row["job"]: row for row in read_row_list(path, columns)}


def read_plan_rows(
    path: str | Path, columns: Sequence[str], digest: str
) -> dict[str, dict[str, Any]]:
    """``read_rows`` of a study's CSV, refused (ValueError) when it holds rows of another plan
    than ``digest`` (their jobs would be mixed in)."""
    rows = read_rows(path, columns)
    other = sorted({str(r["plan"]) for r in rows.values()} - {digest})
    if other:
        raise ValueError(
            f"{path} holds rows of another plan ({other}, this one is {digest}); "
            "use another --csv or the plan that wrote it"
        )
    return rows


def write_row_list(
    path: str | Path, rows: Iterable[Mapping[str, Any]], columns: Sequence[str] = COLUMNS
) -> None:
    """Rewrite the CSV with ``rows`` in the given order (several rows of a job allowed)."""
    _write_atomic(Path(path), columns, rows)


def encode_curve(points: Iterable[tuple[int, float | None]]) -> str:
    """[(step, value), ...] -> "step:value;..." (a missing value is written "nan")."""
    return ";".join(f"{step}:{math.nan if v is None else v:.6g}" for step, v in points)


def decode_curve(text: str | None) -> list[tuple[int, float]]:
    """Inverse of ``encode_curve`` ("" or None -> [])."""
    if not text:
        return []
    pairs = (item.split(":") for item in text.split(";"))
    return [(int(step), float(value)) for step, value in pairs]


def append_session(csv_path: str | Path, session: Mapping[str, Any]) -> None:
    """Add one invocation's row to the sessions sidecar (atomic rewrite)."""
    path = sessions_path(csv_path)
    rows = read_sessions(csv_path)
    _write_atomic(path, SESSION_COLUMNS, [*rows, session])


def session_recorder(
    csv_path: str | Path, workers: int, digest: str, main_epochs: int | None
) -> Callable[[float, float, int], None]:
    """A runner's ``session`` callback, ``(started, finished, jobs run)``: appends that
    invocation to the sessions sidecar with its ``workers``, plan and ``main_epochs``."""

    def record(started: float, finished: float, ran: int) -> None:
        append_session(csv_path, {"started": started, "finished": finished, "jobs_run": ran,
                                  "workers": workers, "plan": digest,
                                  "main_epochs": main_epochs})  # fmt: skip

    return record


def read_sessions(csv_path: str | Path) -> list[dict[str, Any]]:
    """The sessions sidecar's rows (started / finished as floats, jobs_run / workers ints,
    main_epochs an int or None where the row predates the column, plan None where empty).
    An empty or missing started / finished / jobs_run / workers cell is a ValueError naming
    the file, its line and the column."""
    path = sessions_path(csv_path)
    if not path.exists():
        return []
    with path.open(encoding="utf-8", newline="") as fh:
        rows = [{c: _parse(c, r.get(c) or "") for c in SESSION_COLUMNS} for r in csv.DictReader(fh)]
    for line, row in enumerate(rows, start=2):
        empty = [c for c in ("started", "finished", "jobs_run", "workers") if row[c] is None]
        if empty:
            raise ValueError(f"{path}, line {line}: no value in {', '.join(empty)}")
    return rows
