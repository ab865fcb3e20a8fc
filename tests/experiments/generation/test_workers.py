"""The study's worker pool: results as jobs finish, and a clear error (not a hang) when a
worker process dies."""

from __future__ import annotations

import pytest

from experiments.generation.study import in_workers
from tests.helpers.dying_worker import own_pid, square_or_die


def test_results_of_every_item() -> None:
    assert sorted(in_workers(square_or_die, [1, 2, 3], 2, ["a", "b", "c"])) == [1, 4, 9]


def test_a_dead_worker_raises_naming_the_unfinished_jobs() -> None:
    with pytest.raises(RuntimeError, match=r"worker process died.*not finished: .*dies"):
        list(in_workers(square_or_die, [-1], 1, ["dies"]))


def test_every_item_runs_in_a_fresh_process() -> None:
    """One process per job, so that a job's peak memory (getrusage) is its own."""
    pids = list(in_workers(own_pid, [0, 1, 2, 3], 2, ["a", "b", "c", "d"]))
    assert len(set(pids)) == 4
