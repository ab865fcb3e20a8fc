"""experiments.report on a synthetic multirun directory: known numbers in, known table out."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from experiments.reports.sweep import collect_jobs, group_jobs, metrics_table, write_report


def _job(root: Path, num: int, overrides: list[str], metrics: dict | None,
         error: str | None = None) -> None:
    job = root / str(num)
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    if metrics is not None:
        body = {"status": "ok", "metrics": metrics, "train_time_s": 1.0}
        if error is not None:
            body = {"status": "failed", "error": error}
        (job / "results.json").write_text(json.dumps(body))
        rows = [{"step": e, "epoch": e, "val/blob_acc": metrics["val/blob_acc"] * e / 2}
                for e in (1, 2)]
        (job / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture()
def sweep(tmp_path: Path) -> Path:
    values = {("unroll", 0): 0.5, ("unroll", 1): 0.7, ("implicit", 0): 0.9, ("implicit", 1): 0.8}
    for num, ((adjoint, seed), value) in enumerate(values.items()):
        _job(tmp_path, num, [f"adjoint={adjoint}", f"seed={seed}"],
             {"val/blob_acc": value, "val/miou": value / 2})
    _job(tmp_path, 4, ["adjoint=neumann", "seed=0"], {"val/blob_acc": 0.0},
         error="RuntimeError: diverged")
    _job(tmp_path, 5, ["adjoint=phantom", "seed=0"], None)
    return tmp_path


def test_groups_average_over_seeds_only(sweep: Path) -> None:
    rows = group_jobs(collect_jobs(sweep))
    by_adjoint = {row.overrides["adjoint"]: row for row in rows}
    assert set(by_adjoint) == {"unroll", "implicit", "neumann", "phantom"}
    stats = by_adjoint["unroll"].mean_std("val/blob_acc")
    assert stats is not None
    mean, std = stats
    assert mean == pytest.approx(0.6) and std == pytest.approx(statistics.stdev([0.5, 0.7]))
    assert by_adjoint["neumann"].mean_std("val/blob_acc") is None


def test_markdown_table_has_known_cells(sweep: Path) -> None:
    table = metrics_table(group_jobs(collect_jobs(sweep)), metrics=["val/blob_acc", "val/miou"])
    lines = table.markdown().splitlines()
    assert lines[0] == "| adjoint | n | val/blob_acc | val/miou |"
    assert "| unroll | 2/2 | 0.600 ± 0.141 | 0.300 ± 0.071 |" in lines
    assert "| implicit | 2/2 | 0.850 ± 0.071 | 0.425 ± 0.035 |" in lines
    assert "| neumann | 0/1 | – | – |" in lines


def test_report_lists_failed_and_missing_jobs_and_writes_plots(sweep: Path, tmp_path: Path) -> None:
    out = tmp_path / "report"
    path = write_report(sweep, out)
    text = path.read_text()
    assert "RuntimeError: diverged" in text and "no results.json" in text
    for name in ("val_blob_acc.png", "val_blob_acc_curves.png", "val_miou.png"):
        assert (out / name).stat().st_size > 1000


def test_missing_sweep_directory_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="multirun"):
        collect_jobs(tmp_path / "nope")
