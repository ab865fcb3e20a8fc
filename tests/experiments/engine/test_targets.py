"""The ``_target_`` allowlist: every shipped config passes; a malicious config-group YAML is
refused before anything is instantiated (a real ``experiments.train`` subprocess)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from experiments.engine.targets import UnsafeTargetError, check_targets

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(
    "target",
    [
        "implicit_ham.Anderson",
        "implicit_ham.linalg.krylov.CG",
        "implicit_ham.make_context",
        "experiments.data.splits.legend_seg",
        "experiments.engine.sinks.file_sinks",
        "torch.optim.AdamW",
        "torch.optim.lr_scheduler.StepLR",
    ],
)
def test_allowed_targets_pass(target: str) -> None:
    check_targets({"a": {"b": [{"_target_": target}]}})


@pytest.mark.parametrize(
    ("target", "reason"),
    [
        ("os.system", "not under an allowed prefix"),
        ("torch.load", "not under an allowed prefix"),
        ("numpy.load", "not under an allowed prefix"),
        # an attribute path through an allowed module to a foreign object
        ("implicit_ham.reliability.rng.torch.load", "resolves to an object of torch"),
        ("experiments.engine.sinks.Path", "resolves to an object of pathlib"),
    ],
)
def test_other_targets_are_refused_naming_key_and_prefixes(target: str, reason: str) -> None:
    with pytest.raises(UnsafeTargetError) as err:
        check_targets({"data": {"args": [{"_target_": target}]}})
    message = str(err.value)
    assert f"config data.args[0]: _target_ '{target}'" in message and reason in message
    assert "implicit_ham., experiments.data., experiments.models." in message


@pytest.mark.slow
def test_malicious_config_group_yaml_is_refused_before_anything_runs(tmp_path: Path) -> None:
    group = tmp_path / "conf" / "data"
    group.mkdir(parents=True)
    evil = "defaults:\n  - base_legend_seg\n  - _self_\n_target_: os.system\n"
    (group / "evil.yaml").write_text(evil)
    job = tmp_path / "job"
    env = {**os.environ, "WANDB_MODE": "offline", "HYDRA_FULL_ERROR": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.train", "data=evil", "progress=false",
         f"hydra.searchpath=[file://{tmp_path / 'conf'}]", f"hydra.run.dir={job}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "UnsafeTargetError: config data: _target_ 'os.system'" in proc.stderr
    written = {p.name for p in job.iterdir()} if job.exists() else set()
    assert written <= {".hydra", "train.log"}, written  # no results, logs or checkpoints
