"""The ``_target_`` allowlist: every shipped config passes; a malicious config-group YAML
(``os.system``, or ``torch.load`` / ``numpy.load`` of a pickle whose payload would create a
marker file) is refused before anything is instantiated, ``hydra.callbacks`` included (real
``experiments.train`` subprocesses)."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from helpers.train_jobs import train_env
from hydra.utils import instantiate
from omegaconf import OmegaConf

from experiments.engine.targets import UnsafeTargetError, check_hydra_callbacks, check_targets

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


class _Payload:
    """Unpickling it creates the file ``marker``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def _torch_load(payload: Path) -> dict[str, Any]:
    torch.save(_Payload(payload.with_suffix(".ran")), payload)
    return {"_target_": "torch.load", "f": str(payload), "weights_only": False}


def _numpy_load(payload: Path) -> dict[str, Any]:
    payload.write_bytes(pickle.dumps(_Payload(payload.with_suffix(".ran"))))
    return {"_target_": "numpy.load", "file": str(payload), "allow_pickle": True}


LOADERS = {"torch.load": _torch_load, "numpy.load": _numpy_load}


def _refused(tmp_path: Path, override: str) -> subprocess.CompletedProcess[str]:
    job = tmp_path / "job"
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.train", override, "progress=false",
         f"hydra.searchpath=[file://{tmp_path / 'conf'}]", f"hydra.run.dir={job}"],
        cwd=ROOT, env=train_env(), capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert proc.returncode != 0
    written = {p.name for p in job.iterdir()} if job.exists() else set()
    assert written <= {".hydra", "train.log"}, written  # no results, logs or checkpoints
    return proc


@pytest.mark.slow
def test_malicious_config_group_yaml_is_refused_before_anything_runs(tmp_path: Path) -> None:
    group = tmp_path / "conf" / "data"
    group.mkdir(parents=True)
    evil = "defaults:\n  - base_legend_seg\n  - _self_\n_target_: os.system\n"
    (group / "evil.yaml").write_text(evil)
    proc = _refused(tmp_path, "data=evil")
    assert "UnsafeTargetError: config data: _target_ 'os.system'" in proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("loader", list(LOADERS))
def test_a_preset_loading_a_pickle_runs_no_payload(tmp_path: Path, loader: str) -> None:
    """A config-group YAML whose ``_target_`` unpickles a file (``torch.load`` with
    ``weights_only: false``, ``numpy.load`` with ``allow_pickle: true``). As a data option its
    arguments are not keys of the data schema (composition refuses them); as an experiment
    preset's ``hydra.callbacks`` entry (an open node Hydra instantiates before the command
    runs) it reached the payload until ``guard_hydra_callbacks``. Both are refused, and the
    payload, which does run when instantiated (checked first), never runs."""
    node = LOADERS[loader](tmp_path / "payload.bin")
    marker = tmp_path / "payload.ran"
    instantiate(node)  # the payload is live: loading the file runs it
    assert marker.exists()
    marker.unlink()
    for group, text in {
        "data": yaml.safe_dump(node),
        "experiment": "# @package _global_\n"
        + yaml.safe_dump({"hydra": {"callbacks": {"x": node}}}),
    }.items():
        (tmp_path / "conf" / group).mkdir(parents=True, exist_ok=True)
        (tmp_path / "conf" / group / "evil.yaml").write_text(text)
    proc = _refused(tmp_path, "data=evil")
    assert "not in 'TargetConf'" in proc.stderr  # the data schema has no such keys
    proc = _refused(tmp_path, "+experiment=evil")
    assert f"UnsafeTargetError: config hydra.callbacks.x: _target_ '{loader}'" in proc.stderr
    assert not marker.exists(), "the payload ran"


def test_hydras_own_callbacks_pass_the_callback_check() -> None:
    own = {"log": {"_target_": "hydra.experimental.callbacks.LogJobReturnCallback"}}
    check_hydra_callbacks(OmegaConf.create({"hydra": {"callbacks": own}}))
    refused = r"config hydra\.callbacks\.x: _target_ 'os\.system'"
    with pytest.raises(UnsafeTargetError, match=refused):
        check_hydra_callbacks(
            OmegaConf.create({"hydra": {"callbacks": {"x": {"_target_": "os.system"}}}})
        )
