"""The sessions sidecar that study v4 and the public benchmarks read for their compute budget:
a session reads back typed as written, and a session with an empty required cell (a
hand-edited or truncated sidecar) is refused naming the file, the line and the column rather
than counted as 0 jobs or failing later in a report's arithmetic."""

from __future__ import annotations

from pathlib import Path

import pytest

from experiments.studies.csv_rows import append_session, read_sessions, sessions_path


def test_a_session_reads_back_typed(tmp_path: Path) -> None:
    csv = tmp_path / "runs.csv"
    append_session(csv, {"started": 0.5, "finished": 60.0, "jobs_run": 3, "workers": 2,
                         "plan": "abc", "main_epochs": None})  # fmt: skip
    assert read_sessions(csv) == [{"started": 0.5, "finished": 60.0, "jobs_run": 3,
                                   "workers": 2, "plan": "abc", "main_epochs": None}]  # fmt: skip


def test_an_empty_required_cell_is_refused(tmp_path: Path) -> None:
    csv = tmp_path / "runs.csv"
    append_session(csv, {"started": 0.5, "finished": 60.0, "jobs_run": 3, "workers": 2,
                         "plan": "abc", "main_epochs": 4})  # fmt: skip
    sidecar = sessions_path(csv)
    header, row = sidecar.read_text().splitlines()
    sidecar.write_text(f"{header}\n{row}\n{row.replace(',3,', ',,', 1)}\n")
    with pytest.raises(ValueError, match=r"runs\.sessions\.csv, line 3: no value in jobs_run"):
        read_sessions(csv)
