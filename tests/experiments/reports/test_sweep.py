"""End-to-end sweeps through the Hydra entry point (subprocesses): basic and submitit_local
launchers, a failing job that does not stop the others, and the report over the result."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
TINY = [
    "epochs=1",
    "data.train_size=16",
    "data.val_size=8",
    "data.image_size=32",
    "data.num_classes=3",
    "context.rank=4",
    "context.steps=2",
    "context.eval_steps=2",
    "batch_size=8",
    "progress=false",
    "threads=1",
    "diagnostics.every=1",
]

pytestmark = pytest.mark.slow


def _train(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "WANDB_MODE": "offline", "HYDRA_FULL_ERROR": "1"}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "experiments.train",
            "-m",
            *TINY,
            *overrides,
            f"hydra.sweep.dir={tmp_path}",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def _results(sweep: Path) -> dict[str, dict]:
    out = {}
    for path in sorted(sweep.glob("*/results.json")):
        overrides = (path.parent / ".hydra" / "overrides.yaml").read_text()
        out[overrides] = json.loads(path.read_text())
    return out


def test_basic_launcher_multirun_and_report(tmp_path: Path) -> None:
    proc = _train(tmp_path, "adjoint=unroll,implicit")
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = _results(tmp_path)
    assert len(results) == 2
    for result in results.values():
        assert result["status"] == "ok"
        assert 0.0 <= result["metrics"]["val/blob_acc"] <= 1.0
        assert result["config"]["context"]["steps"] == 2
    logged = (tmp_path / "0" / "metrics.jsonl").read_text()
    assert "grad_norm" in logged and "solver/" in logged
    report = subprocess.run(
        [sys.executable, "-m", "experiments.report", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    assert "| adjoint |" in (tmp_path / "report.md").read_text(), report.stderr


def test_submitit_local_launcher(tmp_path: Path) -> None:
    proc = _train(tmp_path, "hydra/launcher=submitit_local", "adjoint=one_step,unroll")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [r["status"] for r in _results(tmp_path).values()] == ["ok", "ok"]


def test_failing_job_does_not_stop_the_sweep(tmp_path: Path) -> None:
    proc = _train(
        tmp_path,
        "solver=anderson",
        "context.steps=5",
        "context.eval_steps=5",
        "adjoint=unroll,one_step",
    )
    assert proc.returncode != 0
    statuses = {k.strip(): v["status"] for k, v in _results(tmp_path).items()}
    assert sorted(statuses.values()) == ["failed", "ok"]
    failed = next(v for v in _results(tmp_path).values() if v["status"] == "failed")
    assert "cannot be unrolled" in failed["error"]


def test_optuna_search_preset_runs_and_reports_the_best_trial(tmp_path: Path) -> None:
    env = {**os.environ, "HYDRA_FULL_ERROR": "1"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "experiments.train",
            "-m",
            "+experiment=optuna_search",
            "hydra.sweeper.n_trials=2",
            *TINY,
            f"hydra.sweep.dir={tmp_path}",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    best = (tmp_path / "optimization_results.yaml").read_text()
    assert "optim.lr" in best and "best_value" in best
    assert len(_results(tmp_path)) == 2
