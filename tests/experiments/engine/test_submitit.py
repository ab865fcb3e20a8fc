"""The parts of the submitit requeue hook, without a job (the end-to-end test, SIGUSR1 to a job
of ``hydra/launcher=submitit_local`` that requeues and resumes identically, is in
``test_preemption.py``, beside the reference run it shares)."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from experiments.engine import submitit_requeue
from experiments.engine.submitit_requeue import TrainJob, preemption_signals


def test_outside_submitit_signals_are_unchanged_and_requeue_is_a_no_op(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("SUBMITIT_FOLDER", raising=False)
    assert preemption_signals([signal.SIGTERM]) == [signal.SIGTERM]
    submitit_requeue.requeue(signal.SIGTERM)  # returns: nothing to requeue


def test_under_submitit_its_preemption_signal_is_handled_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SUBMITIT_FOLDER", "/nonexistent")
    signals = preemption_signals([signal.SIGUSR1, signal.SIGTERM])
    assert signals == [signal.SIGUSR1, signal.SIGTERM, signal.SIGUSR2]  # USR2: submitit's
    assert preemption_signals([signal.SIGUSR2]) == [signal.SIGUSR2]


def test_train_job_checkpoint_resubmits_the_same_job(tmp_path: Path) -> None:
    job = TrainJob()
    delayed = job.checkpoint({"epochs": 1}, tmp_path)
    assert isinstance(delayed.function, TrainJob)
    assert delayed.args == ({"epochs": 1}, tmp_path)
    assert hasattr(delayed.function, "checkpoint")  # requeued again on the next preemption
