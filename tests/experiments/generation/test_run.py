"""``experiments.generate`` end to end at a tiny scale: a run writes its results, curves and
sample grid; a run interrupted after a checkpoint and started again ends exactly like an
uninterrupted one; a finished job is not retrained; a NaN loss is caught by the failure policy
and counted (skip_batch) or stops the run (raise); bad config values fail at start-up."""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.generate_jobs import tiny_generate
from hydra import compose, initialize_config_dir

from experiments.config.typed import typed_config
from experiments.engine.checkpoint import read_checkpoint, write_checkpoint
from experiments.engine.paths import check_write_paths
from experiments.generation import classifier, trainer
from experiments.generation.classifier import CLASSIFIER_VERSION
from experiments.generation.config import (
    GenerateConfig,
    check_generate_config,
    register_generate_configs,
)
from experiments.generation.guard import GanDivergedError
from experiments.generation.run import run_generation
from experiments.generation.trainer import GanTraining
from experiments.models.digit_classifier import HalfDigitClassifier

ROOT = Path(__file__).resolve().parents[3]
TINY = tiny_generate(4, eval_every=2, checkpoint_every=2)


def _config(cache: Path, *extra: str) -> GenerateConfig:
    register_generate_configs()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("generate", overrides=[*TINY, f"metrics.classifier_cache={cache}", *extra])
    return typed_config(cfg, GenerateConfig)


def _untimed(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _untimed(v) for k, v in value.items() if "time" not in k}
    return value


def _rows(job: Path) -> list[dict[str, Any]]:
    lines = (job / "metrics.jsonl").read_text().splitlines()
    return [_untimed(json.loads(line)) for line in lines]


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An untrained classifier in the cache, saved with the tiny config's settings (training
    one to 98 % takes a minute; the metrics' maths is tested in test_gen_metrics.py)."""
    path = tmp_path_factory.mktemp("classifier") / "classifier.pt"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = HalfDigitClassifier().eval()
    settings = {"version": CLASSIFIER_VERSION, "epochs": 1, "val_fraction": 0.2, "seed": 0}
    write_checkpoint(path, {"model": model.state_dict(), "accuracy": 0.1, "settings": settings})
    return path


def test_the_classifier_cache_is_reused_only_with_the_same_settings(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trained = []

    def fake_training(epochs: int, val_fraction: float, seed: int, layout: str = "twin"):
        trained.append(epochs)
        return HalfDigitClassifier().eval(), 0.5

    monkeypatch.setattr(classifier, "train_classifier", fake_training)
    assert classifier.load_or_train_classifier(cache, 1, 0.2, 0)[1] == 0.1 and not trained
    copy = tmp_path / "classifier.pt"
    copy.write_bytes(cache.read_bytes())
    assert classifier.load_or_train_classifier(copy, 2, 0.2, 0)[1] == 0.5 and trained == [2]
    assert classifier.load_or_train_classifier(copy, 2, 0.2, 0)[1] == 0.5 and trained == [2]


@pytest.fixture(scope="module")
def reference(cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    job = tmp_path_factory.mktemp("reference")
    run_generation(_config(cache), job)
    return job


def test_a_tiny_run_writes_results_curves_and_a_sample_grid(reference: Path) -> None:
    results = json.loads((reference / "results.json").read_text())
    assert results["status"] == "ok" and results["steps"] == 4
    names = {"fid", "kid", "kid_std", "precision", "recall", "consistency", "kappa"}
    assert set(results["metrics"]) == names
    assert all(math.isfinite(v) for v in results["metrics"].values())
    assert results["failures"]["total"] == 0 and results["parameters"]["G_context"] > 0
    rows = _rows(reference)
    assert [r["step"] for r in rows if "eval/fid" in r] == [2, 4]
    assert [r["step"] for r in rows if "loss/d" in r] == [1, 2, 3, 4]
    assert (reference / "samples.png").stat().st_size > 0


def test_an_interrupted_run_resumes_to_identical_results(
    cache: Path, reference: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = GanTraining.train_step

    def killed_after_step_3(self: GanTraining, real: torch.Tensor) -> dict[str, float]:
        if self.step == 3:
            raise KeyboardInterrupt("simulated kill")
        return original(self, real)

    monkeypatch.setattr(GanTraining, "train_step", killed_after_step_3)
    with pytest.raises(KeyboardInterrupt):
        run_generation(_config(cache), tmp_path)
    assert not (tmp_path / "results.json").exists()
    assert len(_rows(tmp_path)) > len([r for r in _rows(reference) if r["step"] <= 2])
    monkeypatch.setattr(GanTraining, "train_step", original)
    run_generation(_config(cache), tmp_path)  # resumes from the step-2 checkpoint

    ours = json.loads((tmp_path / "results.json").read_text())
    theirs = json.loads((reference / "results.json").read_text())
    for key in ("metrics", "failures", "steps", "gates", "reference"):
        assert _untimed(ours[key]) == _untimed(theirs[key]), key
    assert _rows(tmp_path) == _rows(reference)
    a, b = read_checkpoint(tmp_path / "checkpoint.pt"), read_checkpoint(reference / "checkpoint.pt")
    for net in ("G", "D", "G_ema"):
        for name, tensor in a[net].items():
            assert torch.equal(tensor, b[net][name]), f"{net}.{name}"


def test_a_finished_job_is_not_retrained(
    cache: Path, reference: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def never(self: GanTraining, real: torch.Tensor) -> dict[str, float]:
        raise AssertionError("a finished job was trained again")

    monkeypatch.setattr(GanTraining, "train_step", never)
    before = (reference / "results.json").read_text()
    results = run_generation(_config(cache), reference)
    assert results["status"] == "ok" and (reference / "results.json").read_text() == before


def _nan_on_second_call(monkeypatch: pytest.MonkeyPatch) -> None:
    original, calls = trainer.hinge_d_loss, []

    def diverging(real: torch.Tensor, fake: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        loss = original(real, fake)
        return loss * float("nan") if len(calls) == 2 else loss

    monkeypatch.setattr(trainer, "hinge_d_loss", diverging)


def test_a_nan_loss_is_skipped_and_counted(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _nan_on_second_call(monkeypatch)
    results = run_generation(_config(cache), tmp_path)
    failures = results["failures"]
    assert failures["by_kind"] == {"loss_nonfinite": 1}
    assert failures["by_layer"] == {"(D loss)": {"loss_nonfinite": 1}}
    assert failures["skipped_updates"] == {"D": 1, "G": 0}
    table = (tmp_path / "tables" / "failures.jsonl").read_text().splitlines()
    assert [json.loads(row)["step"] for row in table] == [1]
    state = read_checkpoint(tmp_path / "checkpoint.pt")
    assert all(torch.isfinite(t).all() for t in state["D"].values() if t.is_floating_point())


def test_a_nan_loss_stops_the_run_under_raise(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _nan_on_second_call(monkeypatch)
    with pytest.raises(GanDivergedError, match="loss_nonfinite"):
        run_generation(_config(cache, "reliability.on_failure=raise"), tmp_path)


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("steps=0", "steps"),
        ("gan.lr_d=-1.0", "gan.lr_d"),
        ("gan.ema_decay=1.0", "gan.ema_decay"),
        ("metrics.knn_k=20", "metrics.samples"),
        ("canvas.val_fraction=0.0", "canvas.val_fraction"),
        ("reliability.on_failure=ignore", "on_failure"),
    ],
)
def test_bad_values_are_refused_naming_the_key(cache: Path, override: str, key: str) -> None:
    with pytest.raises(ValueError, match=key):
        check_generate_config(_config(cache, override))


def test_bad_config_fails_at_start_up_before_writing(tmp_path: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HYDRA_FULL_ERROR": "1"}
    command = [sys.executable, "-m", "experiments.generate", "batch_size=1",
               f"hydra.run.dir={tmp_path / 'job'}"]  # fmt: skip
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "batch_size=1" in proc.stderr
    assert not (tmp_path / "job" / "results.json").exists()


def _same_run(job: Path, reference: Path) -> None:
    ours = json.loads((job / "results.json").read_text())
    theirs = json.loads((reference / "results.json").read_text())
    assert ours["status"] == "ok"
    for key in ("metrics", "failures", "steps", "gates", "reference"):
        assert _untimed(ours[key]) == _untimed(theirs[key]), key
    assert _rows(job) == _rows(reference)  # no row logged twice


@pytest.mark.parametrize("damage", ["every_checkpoint_bad", "garbled_results"])
def test_a_damaged_job_is_named_moved_aside_and_ends_like_an_intact_run(
    cache: Path,
    reference: Path,
    tmp_path: Path,
    damage: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """As in a training job: every checkpoint of a copy of the finished job truncated (no
    results.json), each is named and moved aside and the job starts from scratch in the same
    run; or a garbled results.json, moved aside, the results rebuilt from the last checkpoint."""
    job = tmp_path / "job"
    shutil.copytree(reference, job)
    checkpoints = sorted((job / "checkpoints").glob("step-*.pt"))
    assert len(checkpoints) == 2
    if damage == "every_checkpoint_bad":
        (job / "results.json").unlink()
        for path in checkpoints:
            path.write_bytes(path.read_bytes()[:100])
    else:
        (job / "results.json").write_text('{"status": "ok", "metr')
    with caplog.at_level(logging.WARNING):
        run_generation(_config(cache), job)
    _same_run(job, reference)
    if damage == "every_checkpoint_bad":
        for path in checkpoints:
            assert path.with_name(path.name + ".corrupt").exists()
            assert str(path) in caplog.text
        assert "every checkpoint in" in caplog.text and "starting from scratch" in caplog.text
    else:
        assert (job / "results.json.corrupt").exists()
        assert f"{job / 'results.json'} is damaged" in caplog.text


def test_a_run_killed_before_its_first_checkpoint_starts_over_without_duplicate_rows(
    cache: Path, reference: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = GanTraining.train_step

    def killed_after_step_1(self: GanTraining, real: torch.Tensor) -> dict[str, float]:
        if self.step == 1:
            raise KeyboardInterrupt("simulated kill")
        return original(self, real)

    monkeypatch.setattr(GanTraining, "train_step", killed_after_step_1)
    with pytest.raises(KeyboardInterrupt):
        run_generation(_config(cache), tmp_path)
    assert _rows(tmp_path) and not list((tmp_path / "checkpoints").glob("step-*.pt"))
    monkeypatch.setattr(GanTraining, "train_step", original)
    run_generation(_config(cache), tmp_path)
    _same_run(tmp_path, reference)


def test_a_relative_classifier_cache_is_the_path_that_was_checked(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``metrics.classifier_cache=classifier.pt`` is checked as ``<job>/classifier.pt``
    (``check_write_paths``); the job must use that file, not ``classifier.pt`` in the working
    directory (which the check never saw: it could lie anywhere)."""
    job, elsewhere = tmp_path / "job", tmp_path / "cwd"
    job.mkdir()
    elsewhere.mkdir()
    shutil.copyfile(cache, job / "classifier.pt")
    check_write_paths({"metrics": {"classifier_cache": "classifier.pt"}}, job)

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("the checked cache exists: no classifier may be trained")

    monkeypatch.setattr(classifier, "train_classifier", never)
    monkeypatch.chdir(elsewhere)
    config = _config(cache, "metrics.classifier_cache=classifier.pt")
    assert run_generation(config, job)["status"] == "ok"
    assert not list(elsewhere.iterdir())
