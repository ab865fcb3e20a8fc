"""A tiny end-to-end job: train, score, the results row, the page from it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from experiments.generation.job import GanJob, relative_change, run_job
from experiments.generation.study import append_row, finished, read_rows
from experiments.models.digit_classifier import HalfDigitClassifier


def test_relative_change_compares_the_window_start_with_the_end() -> None:
    curve = [{"step": s, "fid": f} for s, f in [(100, 50.0), (200, 40.0), (400, 20.0), (500, 19.0)]]
    assert relative_change(curve, "fid", 0.2) == pytest.approx(1 / 20)  # step 400 vs 500
    assert relative_change(curve, "fid", 0.6) == pytest.approx(21 / 40)  # step 200 vs 500


@pytest.mark.slow
def test_tiny_job_end_to_end(tmp_path: Path) -> None:
    torch.manual_seed(0)
    classifier = HalfDigitClassifier().eval()  # untrained: the pipeline, not the numbers
    job = GanJob("nmf_one_step", 0, steps=4, eval_every=2, curve_samples=8, samples=16,
                 train_size=32, val_size=16, gate_every=2)  # fmt: skip
    row = run_job(job, classifier, 0.5, str(tmp_path / "grid.png"))
    assert [p["step"] for p in row["curve"]] == [2, 4]
    assert [p["step"] for p in row["gates"]] == [0, 2, 4]
    assert row["plateau"] == (row["fid_change_last"] < 0.05)
    assert row["peak_rss_mib"] >= row["rss_before_mib"] > 0 and row["time_per_step_s"] > 0
    assert (tmp_path / "grid.png").exists()
    results = tmp_path / "results.jsonl"
    append_row(results, row)
    assert finished(read_rows(results), job) == read_rows(results)[0]
