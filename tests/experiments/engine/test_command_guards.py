"""The guards of the commands other than ``experiments.train``: the ``_target_`` allowlist in
``grad_study`` / ``convergence`` (a malicious config-group YAML is refused before anything runs,
in a real subprocess of each)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
EVIL_SOLVER = "defaults:\n  - base_fixed_point\n  - _self_\n_target_: os.system\n"


def _env() -> dict[str, str]:
    return {**os.environ, "WANDB_MODE": "offline", "HYDRA_FULL_ERROR": "1", "OMP_NUM_THREADS": "1"}


def _run(tmp_path: Path, command: str, *overrides: str) -> subprocess.CompletedProcess[str]:
    job = tmp_path / "job"
    return subprocess.run(
        [sys.executable, "-m", f"experiments.{command}", *overrides,
         f"hydra.searchpath=[file://{tmp_path / 'conf'}]", f"hydra.run.dir={job}"],
        cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("command", ["grad_study", "convergence"])
def test_malicious_yaml_is_refused_by_every_command(tmp_path: Path, command: str) -> None:
    group = tmp_path / "conf" / "solver"
    group.mkdir(parents=True)
    (group / "evil.yaml").write_text(EVIL_SOLVER)
    proc = _run(tmp_path, command, "solver=evil")
    assert proc.returncode != 0
    assert "UnsafeTargetError: config solver: _target_ 'os.system'" in proc.stderr, proc.stderr[
        -2000:
    ]
    job = tmp_path / "job"
    written = {p.name for p in job.iterdir()} if job.exists() else set()
    assert written <= {".hydra", "grad_study.log", "convergence.log"}, written
