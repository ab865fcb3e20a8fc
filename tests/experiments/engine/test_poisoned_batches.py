"""Non-finite training data on the default model (``two_stream``) through the real
``experiments.train`` command (``tests/helpers/poisoned_train.py`` poisons one training image):
a NaN pixel (``input_nonfinite``, caught before any model sees it: ``two_stream`` derives
targets from the images, which crashed with "Class values must be non-negative" under every
policy) and an image of ±1e30 (its batch variance overflows a BatchNorm running variance:
``buffer_nonfinite``). Under ``skip_batch`` / ``fallback`` the batch is dropped and the run ends
ok with every event counted; under ``warn`` / ``raise`` the run fails naming the kind."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.train_jobs import ROOT, assert_failures_agree, train_env

ARGS = [
    "epochs=2", "data.train_size=48", "data.val_size=16", "data.image_size=48",
    "data.num_classes=3", "context.rank=4", "context.steps=3", "context.eval_steps=3",
    "batch_size=8", "progress=false", "threads=1",
]  # fmt: skip
LAYER = {"nan_image": "(inputs)", "huge_image": "backbone.layers.0.1.running_var"}
KIND = {"nan_image": "input_nonfinite", "huge_image": "buffer_nonfinite"}

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    ("fault", "policy"),
    [("nan_image", "skip_batch"), ("nan_image", "raise"),
     ("huge_image", "fallback"), ("huge_image", "warn")],
)  # fmt: skip
def test_a_poisoned_image_is_handled_by_the_failure_policy(
    tmp_path: Path, fault: str, policy: str
) -> None:
    command = [sys.executable, str(ROOT / "tests" / "helpers" / "poisoned_train.py"), fault,
               str(tmp_path), *ARGS, f"reliability.on_failure={policy}"]  # fmt: skip
    proc = subprocess.run(command, cwd=ROOT, env=train_env(), capture_output=True, text=True,
                          timeout=240, check=False)  # fmt: skip
    log = proc.stdout + proc.stderr
    assert "Class values must be non-negative" not in log
    results = json.loads((tmp_path / "results.json").read_text())
    if policy in ("skip_batch", "fallback"):
        assert proc.returncode == 0, log[-3000:]
        assert results["status"] == "ok"
        assert results["failures"]["by_kind"] == {KIND[fault]: 2}  # one poisoned batch an epoch
        assert results["failures"]["by_layer"] == {LAYER[fault]: {KIND[fault]: 2}}
        assert results["failures"]["skipped_batches"] == 2
        assert_failures_agree(tmp_path)
    else:
        assert proc.returncode != 0
        assert results["status"] == "failed"
        kind = KIND[fault].replace("_", " ")
        assert results["error"].startswith(f"NonFiniteError: step 5: {kind} ({LAYER[fault]})")
