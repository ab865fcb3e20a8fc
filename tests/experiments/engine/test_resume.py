"""Checkpoint/resume and determinism of ``experiments.train`` end to end (subprocesses).

A run SIGKILLed mid-epoch, whose newest checkpoint is then truncated, and started again with
the same command must finish with exactly the metrics, failure counts, logged rows and
parameters of an uninterrupted run; two fresh runs with the same seed must agree exactly.
Wall-clock fields (``*time*``, ``*seconds*``) are the only ones excluded from the comparison.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from helpers.train_jobs import (
    assert_failures_agree,
    job_parameters,
    job_results,
    metric_rows,
    run_train,
    train_command,
    train_env,
)

ROOT = Path(__file__).resolve().parents[3]
# NMF context: random initial bases are drawn from torch's global RNG at every forward; the
# implicit adjoint logs a failure event at every step (failures.jsonl must agree with results).
ARGS = [
    "epochs=4", "data.train_size=96", "data.val_size=16", "data.image_size=48",
    "data.num_classes=3", "context.rank=4", "context.steps=3", "context.eval_steps=3",
    "batch_size=8", "progress=false", "threads=1", "diagnostics.every=2",
    "reliability.checkpoint_every=5", "reliability.keep=3", "adjoint=implicit",
]  # fmt: skip
STEPS_PER_EPOCH = 12

pytestmark = pytest.mark.slow


def _command(job: Path, *extra: str) -> list[str]:
    return train_command(job, ARGS, *extra)


def _run(job: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return run_train(job, ARGS, *extra)


_env, _results, _rows, _parameters = train_env, job_results, metric_rows, job_parameters


def _assert_same_state(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    job = tmp_path_factory.mktemp("reference")
    proc = _run(job)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return job


def test_same_seed_and_config_give_identical_runs(reference: Path, tmp_path: Path) -> None:
    proc = _run(tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _results(tmp_path) == _results(reference)
    _assert_same_state(_parameters(tmp_path), _parameters(reference))
    assert _rows(tmp_path) == _rows(reference)


def test_killed_run_resumes_to_identical_results(reference: Path, tmp_path: Path) -> None:
    checkpoints = tmp_path / "checkpoints"
    proc = subprocess.Popen(_command(tmp_path), cwd=ROOT, env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + 300
    while not (checkpoints / "step-000000010.pt.sha256").exists():  # written after the .pt
        assert proc.poll() is None and time.monotonic() < deadline, "run ended before step 10"
        time.sleep(0.002)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL
    assert not (tmp_path / "results.json").exists(), "the run finished before it was killed"
    saved = sorted(checkpoints.glob("step-*.pt"))
    newest = saved[-1]
    newest.write_bytes(newest.read_bytes()[:-7])  # truncated: must be detected and skipped
    resumed_from = int(saved[-2].stem.split("-")[1])
    assert resumed_from % STEPS_PER_EPOCH, "expected a mid-epoch checkpoint to resume from"

    proc = _run(tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = proc.stdout + proc.stderr
    assert f"{newest.name} is truncated" in log
    assert f"resuming from {saved[-2]}" in log
    assert _results(tmp_path) == _results(reference)
    _assert_same_state(_parameters(tmp_path), _parameters(reference))
    assert _rows(tmp_path) == _rows(reference)
    assert_failures_agree(tmp_path)


def test_finished_job_is_not_retrained_and_other_configs_are_refused(reference: Path) -> None:
    before = (reference / "results.json").read_text()
    proc = _run(reference)
    assert proc.returncode == 0 and "not retrained" in proc.stdout + proc.stderr
    assert (reference / "results.json").read_text() == before
    proc = _run(reference, "optim.lr=0.01")
    assert proc.returncode != 0 and "different config (optim.lr)" in proc.stderr
    assert (reference / "results.json").read_text() == before
