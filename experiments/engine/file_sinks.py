"""Local file sinks: JSON Lines and CSV, one file for the metrics and one per table.

Layout under ``directory``: ``metrics.jsonl`` / ``metrics.csv`` (one row per ``log`` call,
with a ``step`` column) and ``tables/<name>.jsonl`` / ``tables/<name>.csv`` (one row per table
row, with ``step`` when given). Table names are made file-safe (``/`` becomes ``__``).

JSON Lines keep non-finite floats as ``NaN`` / ``Infinity`` (Python's json reads them back).
CSV and keys appearing later: the header is the union of all keys seen, in order of first
appearance; when a row brings a new key, the file is rewritten once with the extended header
and the earlier rows get an empty cell there. Reading back with ``csv.DictReader`` therefore
always sees one consistent header (cells are strings; empty means "not logged in that row").
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from experiments.engine.write_errors import writing
from implicit_ham.diagnostics import Scalar, Sink, plain_metrics


def safe_name(name: str) -> str:
    """``name`` as a file name: ``/`` becomes ``__``, other unsafe characters ``_``."""
    cleaned = re.sub(r"[^A-Za-z0-9_.-]+", "_", name.replace("/", "__")).strip("._")
    if not cleaned:
        raise ValueError(f"table name {name!r} has no usable characters; use letters or digits")
    return cleaned


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a JSON Lines file."""
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


class _JsonlFile:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.fh: IO[str] = open(path, "a", encoding="utf-8")  # noqa: SIM115 - kept open

    def write(self, row: Mapping[str, Scalar]) -> None:
        with writing(self.fh.name):
            self.fh.write(json.dumps(row) + "\n")
            self.fh.flush()

    def close(self) -> None:
        self.fh.close()


class JSONLSink(Sink):
    """Appends metrics and tables as JSON Lines under ``directory`` (see the module docstring)."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self._files: dict[str, _JsonlFile] = {}

    def _file(self, rel: str) -> _JsonlFile:
        if rel not in self._files:
            self._files[rel] = _JsonlFile(self.directory / rel)
        return self._files[rel]

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        self._file("metrics.jsonl").write({"step": step, **plain_metrics(metrics)})

    def log_table(
        self, name: str, rows: Sequence[Mapping[str, Any]], step: int | None = None
    ) -> None:
        target = self._file(f"tables/{safe_name(name)}.jsonl")
        for row in rows:
            target.write(({} if step is None else {"step": step}) | plain_metrics(row))

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()


class CsvFile:
    """A CSV file whose header grows when rows bring new keys (see the module docstring).

    Args:
        path: the file; an existing file is continued (its header is read back).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.columns: list[str] = []
        if self.path.exists() and self.path.stat().st_size:
            with open(self.path, newline="", encoding="utf-8") as fh:
                self.columns = next(csv.reader(fh), [])

    def write(self, row: Mapping[str, Scalar]) -> None:
        """Append ``row``; rewrite the file first if it has keys the header lacks."""
        new = [k for k in row if k not in self.columns]
        with writing(self.path):
            if new:
                self._rewrite(self.columns + new)
            with open(self.path, "a", newline="", encoding="utf-8") as fh:
                csv.DictWriter(fh, self.columns, restval="").writerow(dict(row))

    def _rewrite(self, columns: list[str]) -> None:
        rows: list[dict[str, str]] = []
        if self.columns:
            with open(self.path, newline="", encoding="utf-8") as fh:
                rows = list(csv.DictReader(fh))
        tmp = self.path.with_suffix(self.path.suffix + ".tmp")
        with open(tmp, "w", newline="", encoding="utf-8") as fh:
            writer = csv.DictWriter(fh, columns, restval="")
            writer.writeheader()
            writer.writerows(rows)
        tmp.replace(self.path)
        self.columns = columns


class CSVSink(Sink):
    """Writes metrics and tables as CSV under ``directory`` (see the module docstring)."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self._files: dict[str, CsvFile] = {}

    def _file(self, rel: str) -> CsvFile:
        if rel not in self._files:
            self._files[rel] = CsvFile(self.directory / rel)
        return self._files[rel]

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        self._file("metrics.csv").write({"step": step, **plain_metrics(metrics)})

    def log_table(
        self, name: str, rows: Sequence[Mapping[str, Any]], step: int | None = None
    ) -> None:
        target = self._file(f"tables/{safe_name(name)}.csv")
        for row in rows:
            target.write(({} if step is None else {"step": step}) | plain_metrics(row))
