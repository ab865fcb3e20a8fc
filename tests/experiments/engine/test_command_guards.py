"""The guards of the commands other than ``experiments.train``: the ``_target_`` allowlist in
``grad_study`` / ``convergence`` (a malicious config-group YAML is refused before anything runs,
in a real subprocess of each), and paths a config makes a job write (``check_write_paths``) stay
under the run or a declared cache directory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from experiments.engine.paths import CACHE_DIR_ENV, UnsafePathError, check_write_paths

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


def test_paths_under_the_job_its_sweep_or_the_declared_cache_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = tmp_path / "sweep" / "3"
    monkeypatch.delenv(CACHE_DIR_ENV, raising=False)
    for value in ("classifier.pt", "../classifier.pt", str(job / "sub" / "c.pt"), None):
        check_write_paths({"metrics": {"classifier_cache": value}}, job)
    cache = tmp_path / "cache"
    monkeypatch.setenv(CACHE_DIR_ENV, str(cache))
    check_write_paths({"metrics": {"classifier_cache": str(cache / "c.pt")}}, job)


@pytest.mark.parametrize(
    "value", ["../../classifier.pt", "/etc/cron.d/evil", "~/.bashrc", "link/c.pt"]
)
def test_paths_outside_are_refused_naming_key_path_and_roots(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    job = tmp_path / "sweep" / "3"
    job.mkdir(parents=True)
    (job / "link").symlink_to(tmp_path.parent)  # a symbolic link out of the run
    monkeypatch.delenv(CACHE_DIR_ENV, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    with pytest.raises(UnsafePathError) as err:
        check_write_paths({"metrics": {"classifier_cache": value}}, job)
    message = str(err.value)
    assert f"metrics.classifier_cache={value!r}" in message
    assert str(job.resolve()) in message and CACHE_DIR_ENV in message
