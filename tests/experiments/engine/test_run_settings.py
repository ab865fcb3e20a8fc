"""``experiments.train``'s run settings, in this process: values refused before anything is
written (issue 47 item 10: ``log_every=0`` was a bare ZeroDivisionError, negative
``max_skips`` / ``checkpoint_every`` were accepted), and a finite divergence that no longer
ends "ok" with no event (item 9: ``optim.lr=1000`` ended ok with val/loss 5242)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from experiments.config.groups import TrainConfig, register_configs
from experiments.config.typed import typed_config
from experiments.engine.callbacks import SkipLimitError
from experiments.engine.run import run_training

CONF = Path(__file__).resolve().parents[3] / "conf"
BASE = [
    "epochs=4", "data.train_size=64", "data.val_size=8", "data.image_size=32",
    "data.num_classes=2", "context.rank=2", "context.steps=2", "context.eval_steps=2",
    "batch_size=8", "progress=false", "threads=1", "diagnostics.enabled=false", "log_every=1",
]  # fmt: skip


def _config(*overrides: str) -> TrainConfig:
    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return typed_config(compose("config", overrides=[*BASE, *overrides]), TrainConfig)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("log_every=0", r"log_every must be an integer >= 1, got 0"),
        ("reliability.max_skips=-1", r"max_skips must be an integer >= 0, got -1"),
        ("reliability.checkpoint_every=-1", r"checkpoint_every must be an integer >= 0, got -1"),
        ("reliability.keep=0", r"keep must be an integer >= 1, got 0"),
        ("reliability.on_failure=ignore", r"on_failure must be one of"),
        ("reliability.divergence_steps=-2", r"divergence_steps must be an integer >= 0"),
        ("reliability.divergence_factor=0.5", r"factor must be a number > 1, got 0.5"),
    ],
)
def test_bad_run_settings_are_refused_before_anything_is_written(
    tmp_path: Path, override: str, message: str
) -> None:
    job = tmp_path / "job"
    with pytest.raises(ValueError, match=message):
        run_training(_config(override), job)
    assert not job.exists()


def _run(job: Path, *overrides: str) -> dict:
    threads = torch.get_num_threads()
    try:
        return run_training(_config(*overrides), job)
    finally:
        torch.set_num_threads(threads)


def test_finite_divergence_is_a_failure_event_under_the_policy(tmp_path: Path) -> None:
    """lr=1000: the loss climbs from 1.25 to 1e2-1e7 and stays finite. Under skip_batch every
    step from the 10th in a row above 10x the lowest smoothed loss is skipped, until
    max_consecutive_skips (10) stops the run (failed, the events counted); under warn the run
    ends ok with the events counted; with the check off (divergence_steps=0) it ends ok with
    no event, as every run did before."""
    skip = tmp_path / "skip"
    with pytest.raises(SkipLimitError, match="10 batches in a row"):
        _run(skip, "optim.lr=1000", "reliability.on_failure=skip_batch")
    failed = json.loads((skip / "results.json").read_text())
    assert failed["status"] == "failed"
    assert failed["failures"]["by_kind"] == {"loss_diverged": 10}
    warned = _run(tmp_path / "warn", "optim.lr=1000", "reliability.on_failure=warn")
    assert warned["status"] == "ok" and warned["failures"]["by_kind"]["loss_diverged"] >= 1
    rows = [json.loads(r) for r in (tmp_path / "warn" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["train/loss"] for r in rows if "epoch" not in r and "train/loss" in r]
    first = losses[0]
    # independent count: steps whose loss is > 10x the first loss (the lowest smoothed value
    # can only be lower, so at least these are "above")
    assert sum(loss > 10 * first for loss in losses) >= 10
    off = _run(tmp_path / "off", "optim.lr=1000", "reliability.divergence_steps=0")
    assert off["status"] == "ok" and off["failures"]["total"] == 0
