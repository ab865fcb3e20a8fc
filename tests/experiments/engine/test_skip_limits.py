"""Bounded failure policy: ``Trainer.fit`` with the ``SkipLimits`` callback stops with
``SkipLimitError`` once the failure policy has skipped ``max_consecutive_skips`` batches in a
row or ``max_skips`` in total."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers.train_jobs import assert_failures_agree, failure_rows
from torch import Tensor, nn

from experiments.engine.callbacks import SkipLimitError, SkipLimits
from experiments.engine.state import TrainState
from experiments.engine.task import Task
from experiments.engine.trainer import Trainer

ROOT = Path(__file__).resolve().parents[3]


def _batches(n: int) -> list[tuple[Tensor, Tensor]]:
    gen = torch.Generator().manual_seed(0)
    return [(torch.randn(4, 3, generator=gen), torch.randint(0, 2, (4,), generator=gen))
            for _ in range(n)]  # fmt: skip


def _fit(
    skip: set[int], state: TrainState, max_consecutive_skips: int = 0, max_skips: int = 0
) -> None:
    model = nn.Linear(3, 2)
    task = Task("classification", 2)

    def step_fn(inputs: Tensor, target: Tensor, step: int) -> Tensor | None:
        return None if step in skip else task.loss(model(inputs), target).detach()

    limits = SkipLimits(max_consecutive_skips, max_skips)
    trainer = Trainer(model, task, step_fn, device=torch.device("cpu"), callbacks=[limits])
    trainer.fit(_batches(8), _batches(2), epochs=2, state=state)


def test_consecutive_skips_end_the_run_at_the_limit() -> None:
    state = TrainState()
    with pytest.raises(SkipLimitError, match=r"3 batches in a row .*up to step 4"):
        _fit({2, 3, 4, 6}, state, max_consecutive_skips=3)
    assert (state.step, state.skipped, state.consecutive_skipped) == (5, 3, 3)


def test_a_trained_batch_resets_the_run_of_skips() -> None:
    state = TrainState()
    _fit({1, 2, 4, 5, 9, 10}, state, max_consecutive_skips=3)  # never 3 in a row
    assert (state.epoch, state.skipped) == (3, 6)


def test_total_skips_end_the_run_at_the_cap() -> None:
    state = TrainState()
    with pytest.raises(SkipLimitError, match=r"4 batches skipped .* in total .* step 9"):
        _fit({0, 3, 6, 9, 12}, state, max_skips=4)
    assert state.skipped == 4


def test_no_limit_by_zero() -> None:
    state = TrainState()
    _fit(set(range(16)), state)
    assert state.skipped == 16


@pytest.mark.slow
def test_diverging_run_under_skip_batch_fails_with_the_reason(tmp_path: Path) -> None:
    """A real run ends ``failed`` with the reason, and its ``results.json`` (written by the
    command after the error) counts the failure events the run logged."""
    args = [
        "epochs=2", "data.train_size=48", "data.val_size=16", "data.image_size=32",
        "data.num_classes=3", "context.rank=4", "context.steps=3", "context.eval_steps=3",
        "batch_size=8", "progress=false", "threads=1", "optim.lr=1e8",
        "reliability.on_failure=skip_batch", "reliability.max_consecutive_skips=2",
    ]  # fmt: skip
    env = {**os.environ, "WANDB_MODE": "offline", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "experiments.train", *args,
                           f"hydra.run.dir={tmp_path}"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=240, check=False)  # fmt: skip
    assert proc.returncode != 0
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["status"] == "failed"
    assert "SkipLimitError: 2 batches in a row" in results["error"]
    rows = failure_rows(tmp_path)
    assert [row["action"] for row in rows][-2:] == ["skipped", "skipped"]
    # the failed run's results count the events it logged, as a finished run's do
    assert_failures_agree(tmp_path)
    skipped = {row["step"] for row in rows if row["action"] == "skipped"}
    assert results["failures"]["skipped_batches"] == len(skipped) >= 2
