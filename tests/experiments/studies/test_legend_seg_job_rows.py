"""The stress test's committed per-job rows: written from a study folder, and a later run
compared with them (bit-identical parameters by digest, the largest metric change, jobs on one
side only)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.studies.legend_seg.data import load_study
from experiments.studies.legend_seg.job_rows import compare, job_rows, main, read_rows, write_rows


def _job(sweep: Path, num: int, context: str, seed: int, miou: float, digest: str) -> None:
    job = sweep / str(num)
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "overrides.yaml").write_text(
        f"- context={context}\n- seed={seed}\n- +experiment=adjoint_ablation\n")
    (job / "results.json").write_text(json.dumps({
        "status": "ok", "metrics": {"val/miou": miou, "val/blob_acc": miou + 0.05},
        "train_time_s": 30.0, "state_digests": [digest]}))  # fmt: skip


@pytest.fixture()
def study(tmp_path: Path) -> Path:
    root = tmp_path / "study"
    for num, (context, seed, miou) in enumerate([("nmf", 0, 0.9), ("nmf", 1, 0.8),
                                                 ("vq", 0, 0.5)]):  # fmt: skip
        _job(root / "adjoints", num, context, seed, miou, f"d{num}")
    return root


def test_rows_name_each_jobs_arm_seed_metrics_and_digest(study: Path, tmp_path: Path) -> None:
    path = write_rows(load_study(study), tmp_path / "rows.csv")
    rows = read_rows(path)
    assert [(r["sweep"], r["arm"], r["seed"], r["state_digest"]) for r in rows] == [
        ("adjoints", "context=nmf", "0", "d0"), ("adjoints", "context=nmf", "1", "d1"),
        ("adjoints", "context=vq", "0", "d2")]  # fmt: skip
    assert float(rows[2]["val/blob_acc"]) == pytest.approx(0.55)
    assert rows[0]["cpu"] and rows[0]["commit"]


def test_a_run_compared_with_its_own_rows_is_identical(study: Path, tmp_path: Path) -> None:
    rows = read_rows(write_rows(load_study(study), tmp_path / "rows.csv"))
    result = compare(job_rows(load_study(study)), rows)
    assert (result.both, result.identical, result.only_run, result.only_rows) == (3, 3, 0, 0)
    assert result.largest == {"val/miou": 0.0, "val/blob_acc": 0.0}


def test_a_drifted_job_and_a_missing_one_are_counted(study: Path, tmp_path: Path) -> None:
    rows = read_rows(write_rows(load_study(study), tmp_path / "rows.csv"))
    rows[1] = {**rows[1], "state_digest": "other", "val/miou": "0.75"}  # job 1 drifted
    rows[2] = {**rows[2], "seed": "7"}  # the vq job ran with another seed there
    result = compare(job_rows(load_study(study)), rows)
    assert (result.both, result.identical, result.only_run, result.only_rows) == (2, 1, 1, 1)
    assert result.largest["val/miou"] == pytest.approx(0.05)
    assert result.largest["val/blob_acc"] == pytest.approx(0.0)


def test_the_command_logs_the_comparison(
    study: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = write_rows(load_study(study), tmp_path / "rows.csv")
    with caplog.at_level("INFO"):
        main([str(study), "--rows", str(path)])
    assert "3 of 3 jobs ok in both have bit-identical parameters" in caplog.text


def test_failed_jobs_blank_metrics_and_duplicates_are_not_hidden(
    study: Path, tmp_path: Path
) -> None:
    rows = read_rows(write_rows(load_study(study), tmp_path / "rows.csv"))
    rows[0] = {**rows[0], "status": "failed"}  # ok in the run, failed in the rows
    rows[1] = {**rows[1], "val/miou": ""}  # a metric on one side only
    result = compare(job_rows(load_study(study)), rows)
    assert (result.both, result.not_ok, result.unmatched) == (2, 1, 1)
    with pytest.raises(ValueError, match="two jobs of the rows"):
        compare(job_rows(load_study(study)), [*rows, rows[2]])


def test_nothing_to_compare_exits_non_zero(study: Path, tmp_path: Path) -> None:
    rows = read_rows(write_rows(load_study(study), tmp_path / "rows.csv"))
    assert compare([], rows).largest == {"val/miou": None, "val/blob_acc": None}
    empty = tmp_path / "empty.csv"
    empty.write_text(",".join(rows[0]) + "\n")
    with pytest.raises(SystemExit, match="nothing compared"):
        main([str(study), "--rows", str(empty)])


def test_a_row_takes_the_host_its_job_recorded(study: Path, tmp_path: Path) -> None:
    """A job's own ``host`` (written at its end) names the row's cpu and commit, not the
    process that writes the rows."""
    path = study / "adjoints" / "1" / "results.json"
    results = json.loads(path.read_text())
    path.write_text(json.dumps({**results, "host": {"cpu": "Other CPU", "commit": "abc123",
                                                    "torch": "2.13.0"}}))  # fmt: skip
    rows = read_rows(write_rows(load_study(study), tmp_path / "rows.csv"))
    assert (rows[1]["cpu"], rows[1]["commit"]) == ("Other CPU", "abc123")
    assert rows[0]["commit"] != "abc123"
