"""``run_training`` in this process on a tiny job: a finished job is skipped before its data and
model are built (none of the engine's builders is called), ``results.json`` carries the thread
count and the library's warning events (issue 24 item 6), and a resume with another thread
count is refused or warned about with both numbers."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

import experiments.engine.run as engine_run
from experiments.config.groups import TrainConfig, register_configs
from experiments.config.typed import typed_config
from experiments.engine.checkpoint import CheckpointStore
from experiments.engine.provenance import cpu_model, library_commit
from experiments.engine.results import read_results
from experiments.engine.resume import CHECKPOINT_DIR, ResumeConflictError, reshard_batch
from experiments.engine.run import run_training

CONF = Path(__file__).resolve().parents[3] / "conf"
TINY = [
    "epochs=1", "data.train_size=16", "data.val_size=8", "data.image_size=32",
    "data.num_classes=2", "context.rank=2", "context.steps=2", "context.eval_steps=2",
    "batch_size=8", "progress=false", "threads=1", "diagnostics.enabled=false",
    "adjoint=implicit", "adjoint.max_steps=1", "adjoint.tol=1e-12",
]  # fmt: skip


def _config(*overrides: str) -> TrainConfig:
    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return typed_config(compose("config", overrides=[*TINY, *overrides]), TrainConfig)


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    job = tmp_path_factory.mktemp("job")
    threads = torch.get_num_threads()
    try:
        run_training(_config(), job)
    finally:
        torch.set_num_threads(threads)
    return job


def test_a_finished_job_is_skipped_before_data_and_model_are_built(
    finished: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What skipping costs is counted, not timed (a loaded machine makes any wall-clock bound
    flaky): none of the engine's builders (data, loaders, context, model, optimiser, sinks)
    is called; the results and newest checkpoint are read, nothing else."""
    built: list[str] = []
    builders = ("build_datasets", "build_loaders", "build_context", "build_model",
                "build_optimizer", "build_sinks")  # fmt: skip
    for name in builders:

        def counting(*args: object, _name: str = name, **kwargs: object) -> None:
            built.append(_name)
            raise AssertionError(f"{_name} must not run for a finished job")

        monkeypatch.setattr(engine_run, name, counting)
    results = run_training(_config(), finished)
    assert built == []
    assert results == read_results(finished)


def test_results_carry_threads_and_the_runs_warning_events(finished: Path) -> None:
    results = read_results(finished)
    assert results["threads"] == 1
    # where it ran: this process's processor and torch, the checkout's commit (12 hex digits)
    assert results["host"]["cpu"] == cpu_model() and results["host"]["torch"] == torch.__version__
    assert results["host"]["commit"] == library_commit()
    events = results["events"]
    # a one-iteration implicit backward at tol 1e-12 misses its tolerance at every step: the
    # library's ledger counted those events, and the run's summary has them by kind and source
    assert events["total"] == sum(events["by_kind"].values()) > 0
    assert (
        sum(n for kinds in events["by_source"].values() for n in kinds.values()) == events["total"]
    )
    assert set(events["by_kind"]) <= {
        "ConvergenceWarning",
        "NotFixedPointWarning",
        "ConditioningWarning",
    }


def _unfinish(job: Path, tmp_path: Path) -> Path:
    """A copy of ``job`` that looks interrupted after its first epoch (no results.json)."""
    import shutil

    copy = tmp_path / "job"
    shutil.copytree(job, copy)
    (copy / "results.json").unlink()
    return copy


def test_resume_with_another_thread_count_is_refused_by_default(
    finished: Path, tmp_path: Path
) -> None:
    job = _unfinish(finished, tmp_path)
    threads = torch.get_num_threads()
    try:
        with pytest.raises(ResumeConflictError, match=r"with 1 CPU thread\(s\).*this run has 2"):
            run_training(_config("threads=2", "epochs=1"), job)
    finally:
        torch.set_num_threads(threads)


def test_resume_with_another_thread_count_warns_with_both_numbers_when_allowed(
    finished: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    job = _unfinish(finished, tmp_path)
    store = CheckpointStore(job / CHECKPOINT_DIR)
    latest = store.latest()
    assert latest is not None and latest[1]["threads"] == 1
    threads = torch.get_num_threads()
    try:
        with caplog.at_level(logging.WARNING):
            results = run_training(_config("threads=2", "reliability.threads_change=warn"), job)
    finally:
        torch.set_num_threads(threads)
    assert results["status"] == "ok" and results["threads"] == 2
    # the earlier segment's warning events are carried in the checkpoint (nothing was left to
    # train: the checkpoint is past the last epoch)
    assert results["events"] == read_results(finished)["events"]
    assert any("1 CPU thread(s)" in r.message and "has 2" in r.message for r in caplog.records)


@pytest.mark.parametrize(
    ("batch", "old", "new", "expected"),
    [(3, 2, 2, 3), (3, 1, 2, 1), (4, 1, 2, 2), (3, 2, 1, 6), (5, 2, 3, 3), (0, 4, 2, 0)],
)
def test_reshard_batch_keeps_the_samples_consumed_rounded_down(
    batch: int, old: int, new: int, expected: int
) -> None:
    # samples consumed = batch * old (per-rank batch 1); whole new global batches of `new`
    assert reshard_batch(batch, old, new) == expected == (batch * old) // new
