"""``docs/generation.md`` from a sweep: the table's mean ± std, the verdict computed from them,
the grids and curves, the failed jobs."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from experiments.generation.evaluate import save_grid
from experiments.generation.report import ordered_rows, verdict, write_generation_report
from experiments.reports.sweep import collect_jobs

FIDS = {"none": [40.0, 44.0, 42.0], "self_attention": [30.0, 31.0, 32.0],
        "nmf_one_step": [20.0, 21.0, 22.0], "nmf_unroll": [21.0, 30.0, 15.0]}  # fmt: skip


CONFIG = {"steps": 10, "batch_size": 4, "gan": {}, "metrics": {}, "canvas": {}}


def _job(directory: Path, arm: str, seed: int, fid: float, config: dict = CONFIG) -> None:
    (directory / ".hydra").mkdir(parents=True)
    (directory / ".hydra" / "overrides.yaml").write_text(
        f"- seed={seed}\n- +arm={arm}\n- +experiment=generation\n"
    )
    metrics = {"fid": fid, "kid": fid / 100, "kid_std": 0.1, "precision": 0.5, "recall": 0.4,
               "consistency": 0.3}  # fmt: skip
    results = {
        "status": "ok", "metrics": metrics, "reference": {**metrics, "fid": 3.0},
        "config": config,
        "classifier_accuracy": 0.99, "steps": 10, "train_time_s": 20.0, "eval_time_s": 2.0,
        "parameters": {"G": 100, "D": 90, "G_context": 10, "D_context": 9},
        "failures": {"total": 1, "skipped_updates": {"D": 1, "G": 0}},
    }  # fmt: skip
    (directory / "results.json").write_text(json.dumps(results))
    rows = [{"step": s, "loss/d": 1.0, "loss/g": 0.5} for s in (5, 10)]
    rows += [{"step": 10, "eval/fid": fid}]
    (directory / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    save_grid(np.zeros((4, 1, 32, 32), dtype=np.float32), directory / "samples.png", columns=2)


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    number = 0
    for seed in range(3):
        for arm, fids in FIDS.items():
            _job(tmp_path / "sweep" / str(number), arm, seed, fids[seed])
            number += 1
    failed = tmp_path / "sweep" / str(number)
    (failed / ".hydra").mkdir(parents=True)
    (failed / ".hydra" / "overrides.yaml").write_text("- seed=3\n- +arm=none\n")
    (failed / "results.json").write_text(json.dumps({"status": "failed", "error": "boom"}))
    return tmp_path / "sweep"


def test_verdict_is_computed_from_means_and_stds(sweep: Path) -> None:
    sentence = verdict(ordered_rows(collect_jobs(sweep)))
    assert "Lowest mean FID: Hamburger NMF, one-step (HamGAN) (21.0 ± 1.0" in sentence
    assert "vs no context: one-step better (FID 21.0 ± 1.0 vs 42.0 ± 2.0)" in sentence
    assert "vs self-attention (SAGAN-style): one-step better (FID 21.0 ± 1.0 vs 31.0" in sentence
    assert "vs Hamburger NMF, BPTT: no resolvable difference (FID 21.0 ± 1.0 vs 22.0" in sentence
    assert "Most consistent halves: no context (0.300; real data 0.300)" in sentence


def test_the_page_has_the_table_grids_curves_and_failures(sweep: Path, tmp_path: Path) -> None:
    out = write_generation_report(sweep, tmp_path / "docs" / "generation.md", "make generate")
    text = out.read_text()
    assert "| no context | 3/4 | 42.0 ± 2.0 |" in text
    assert "| real data (reference) | – | 3.0 |" in text
    assert "boom" in text and "make generate" in text
    for name in ("none", "self_attention", "nmf_one_step", "nmf_unroll", "real", "curves"):
        assert (tmp_path / "docs" / "generation" / f"{name}.png").stat().st_size > 0
        assert f"generation/{name}.png" in text


def test_one_seed_is_not_enough_for_a_claim(tmp_path: Path) -> None:
    _job(tmp_path / "s" / "0", "nmf_one_step", 0, 10.0)
    _job(tmp_path / "s" / "1", "none", 0, 50.0)
    sentence = verdict(ordered_rows(collect_jobs(tmp_path / "s")))
    assert "vs no context: not comparable yet (fewer than 2 seeds) (FID 10.0" in sentence


def test_the_page_states_the_sweeps_wall_clock(sweep: Path, tmp_path: Path) -> None:
    """First job's start (multirun.yaml) to last job's end (newest results.json), in minutes."""
    out = tmp_path / "docs" / "generation.md"
    write_generation_report(sweep, out)
    assert "The sweep took" not in out.read_text()  # no multirun.yaml: no claim
    (sweep / "multirun.yaml").write_text("hydra: {}\n")
    os.utime(sweep / "multirun.yaml", (1000.0, 1000.0))
    for number, results in enumerate(sorted(sweep.glob("*/results.json"))):
        os.utime(results, (1000.0 + 60.0 * number, 1000.0 + 60.0 * number))
    last = 60.0 * (len(list(sweep.glob("*/results.json"))) - 1)
    write_generation_report(sweep, out)
    assert f"The sweep took {last / 60:.1f} min wall-clock" in out.read_text()


def test_the_pages_settings_come_from_the_jobs_configs(tmp_path: Path) -> None:
    """Optimiser, EMA, threads, parallel jobs, the ham's rank and steps and the failure policy
    are quoted from the saved configs and multirun.yaml (values unlike the presets'); a config
    without them gives ``?``."""
    config = {**CONFIG, "threads": 3,
              "gan": {"lr_d": 0.001, "lr_g": 0.0005, "beta1": 0.5, "beta2": 0.95,
                      "ema_decay": 0.9, "max_consecutive_failures": 7},
              "context": {"rank": 5, "steps": 4},
              "reliability": {"on_failure": "fallback"}}  # fmt: skip
    for number, arm in enumerate(("nmf_one_step", "none")):
        _job(tmp_path / "sweep" / str(number), arm, 1, 20.0 + number, config)
    (tmp_path / "sweep" / "multirun.yaml").write_text("hydra:\n  launcher:\n    n_jobs: 4\n")
    out = write_generation_report(tmp_path / "sweep", tmp_path / "docs" / "generation.md")
    text = out.read_text()
    assert "(Adam, lr 0.001 / 0.0005, betas (0.5, 0.95)), EMA decay 0.9;" in text
    assert "3 thread per job, 4 jobs at a time." in text
    assert "with `NMF` (rank 5, 4 steps) under `OneStep()`" in text
    assert "`reliability.on_failure=fallback`" in text and "; 7 dropped in a row" in text
    assert "## Samples (seed 1, EMA generator)" in text
    bare = tmp_path / "bare"
    _job(bare / "0", "nmf_one_step", 0, 20.0)
    text = write_generation_report(bare, tmp_path / "bare_docs" / "generation.md").read_text()
    assert "? thread per job, ? jobs at a time." in text and "(rank ?, ? steps)" in text
