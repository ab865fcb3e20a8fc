"""Issue 47 items 3 and 7(a): a command refused for a job directory (a bad value, a lock held
by a live run, a config that conflicts with the job's checkpoints) leaves every file of that
directory byte-identical: no ``results.json`` "failed" over a finished job, no ``.hydra/``
rewritten with settings the job never trained with."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from helpers.train_jobs import job_results, run_train

from experiments.engine.joblock import JobLock

ARGS = [
    "epochs=1", "data.train_size=16", "data.val_size=8", "data.image_size=32",
    "data.num_classes=3", "context.rank=4", "context.steps=2", "context.eval_steps=2",
    "batch_size=8", "progress=false", "threads=1", "log_every=1",
]  # fmt: skip

pytestmark = pytest.mark.slow


def _hashes(job: Path) -> dict[str, str]:
    return {
        str(p.relative_to(job)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(job.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    job = tmp_path_factory.mktemp("finished")
    proc = run_train(job, ARGS)
    assert proc.returncode == 0, proc.stderr[-3000:]
    job_results(job)  # status ok
    assert (job / ".hydra" / "overrides.yaml").is_file()  # the job's own record, kept
    return job


@pytest.mark.parametrize(
    "refused",
    [
        ["reliability.on_failure=ignore"],
        ["reliability.keep=0"],
        ["reliability.preempt_signals=[SIGKILL]"],
        ["log_every=0"],
        ["seed=7"],  # another experiment: its checkpoints conflict (ResumeConflictError)
    ],
)
def test_refused_command_leaves_a_finished_job_byte_identical(
    finished: Path, refused: list[str]
) -> None:
    before = _hashes(finished)
    proc = run_train(finished, ARGS, *refused)
    assert proc.returncode != 0
    assert _hashes(finished) == before, proc.stderr[-2000:]


def test_command_refused_by_a_held_lock_writes_nothing(finished: Path) -> None:
    """The lock held by a live process (this one), as by a running job: the second command,
    with another value, is refused and writes nothing (it used to write "failed" with its own
    config, and Hydra its overrides, while the first run held the lock)."""
    before = _hashes(finished)
    with JobLock(finished):
        held = _hashes(finished)
        proc = run_train(finished, ARGS, "reliability.max_skips=3")
        assert proc.returncode != 0 and "in use by another run" in proc.stderr
        assert _hashes(finished) == held
    assert {k: v for k, v in _hashes(finished).items() if k != ".lock"} == {
        k: v for k, v in before.items() if k != ".lock"
    }
