"""legend_seg needs global context: after the same short training run, the model without a
context module stays near chance on blob pixels while the same model with attention is far above.

Smoke scale of the README's legend_seg comparison (64x64, 4 classes, 15 epochs): 32x32 images
with 3 classes (chance on blob pixels: 1/3, less when blobs are mistaken for background),
composed from ``conf/`` exactly as ``experiments.train`` does and run through ``run_training``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from experiments.config.groups import TrainConfig, register_configs
from experiments.config.typed import typed_config
from experiments.engine.run import run_training

CONF = Path(__file__).resolve().parents[3] / "conf"
SMOKE = [
    "data.image_size=32",
    "data.num_classes=3",
    "data.train_size=1536",
    "data.val_size=128",
    "epochs=6",
    "threads=1",
    "progress=false",
    "logger=none",
    "diagnostics=off",
]

pytestmark = pytest.mark.slow


def _blob_accuracy(tmp_path: Path, context: str) -> float:
    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=[f"context={context}", *SMOKE])
    results = run_training(typed_config(cfg, TrainConfig), tmp_path / context)
    return results["metrics"]["val/blob_acc"]


def test_only_a_global_context_module_finds_the_blob_classes(tmp_path: Path) -> None:
    without_context = _blob_accuracy(tmp_path, "none")
    with_attention = _blob_accuracy(tmp_path, "sdpa_attention")
    assert without_context < 0.45, f"no-context model at {without_context:.3f}, not near chance"
    assert with_attention > 0.7, f"attention model at {with_attention:.3f}"
