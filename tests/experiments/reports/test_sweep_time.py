"""A sweep's wall-clock span: the union of its jobs' training intervals, right for a sweep that
was stopped and resumed (Hydra rewrites ``multirun.yaml`` on resume)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from experiments.reports.sweep_jobs import collect_jobs
from experiments.reports.sweep_time import sweep_span_s, union_seconds, wall_clock

T0 = 1_700_000_000.0


def _finished(sweep: Path, num: int, end: float, train_s: float | None) -> None:
    job = sweep / str(num)
    job.mkdir(parents=True)
    path = job / "results.json"
    body = {"status": "ok"} if train_s is None else {"status": "ok", "train_time_s": train_s}
    path.write_text(json.dumps(body))
    os.utime(path, (end, end))


def test_union_counts_overlaps_once_and_gaps_not_at_all() -> None:
    assert union_seconds([]) == 0.0
    assert union_seconds([(0, 10), (5, 12), (20, 25), (21, 22)]) == pytest.approx(17.0)
    assert union_seconds([(20, 25), (0, 10), (10, 11)]) == pytest.approx(16.0)


def test_a_resumed_sweep_counts_its_jobs_not_the_pause(tmp_path: Path) -> None:
    """Two jobs at a time ran 0..100 s and 50..160 s; the study was stopped, and an hour later
    resumed: Hydra rewrote multirun.yaml (after the first two results) and a third job ran
    30 s. The span from multirun.yaml to the last result gave 30 s before the fix: the first
    invocation's work was lost."""
    sweep = tmp_path / "adjoints"
    _finished(sweep, 0, T0 + 100, 100.0)
    _finished(sweep, 1, T0 + 160, 110.0)
    (sweep / "multirun.yaml").write_text("hydra:\n  launcher:\n    n_jobs: 2\n")
    resumed = T0 + 3760
    os.utime(sweep / "multirun.yaml", (resumed, resumed))
    _finished(sweep, 2, resumed + 30, 30.0)
    assert sweep_span_s(collect_jobs(sweep)) == pytest.approx(160.0 + 30.0)
    assert wall_clock(collect_jobs(sweep), sweep) == "3 min 10 s, 2 jobs at a time"


def test_a_sweep_whose_jobs_all_finished_before_the_resume_is_positive(tmp_path: Path) -> None:
    sweep = tmp_path / "context"
    _finished(sweep, 0, T0 + 40, 40.0)
    (sweep / "multirun.yaml").write_text("{}")
    os.utime(sweep / "multirun.yaml", (T0 + 900, T0 + 900))
    assert sweep_span_s(collect_jobs(sweep)) == pytest.approx(40.0)


def test_no_recorded_training_time_gives_no_span(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    _finished(sweep, 0, T0, None)
    (sweep / "1").mkdir()
    (sweep / "1" / "results.json").write_text("{not json")
    jobs = collect_jobs(sweep)
    assert sweep_span_s(jobs) is None and wall_clock(jobs, sweep) is None


def test_failed_and_non_finite_times_are_left_out(tmp_path: Path) -> None:
    """A failed or preempted job records no training time; a hand-written Infinity, a boolean
    or a negative time is not a time: none of them may stretch or break the span."""
    sweep = tmp_path / "sweep"
    _finished(sweep, 0, T0 + 50, 50.0)
    for num, body in enumerate(['{"status": "failed", "error": "diverged"}',
                                '{"status": "preempted"}', '{"train_time_s": Infinity}',
                                '{"train_time_s": true}', '{"train_time_s": -5}'], start=1):
        (sweep / str(num)).mkdir()
        (sweep / str(num) / "results.json").write_text(body)
    assert sweep_span_s(collect_jobs(sweep)) == pytest.approx(50.0)
    assert wall_clock(collect_jobs(sweep), sweep) == "0 min 50 s"
