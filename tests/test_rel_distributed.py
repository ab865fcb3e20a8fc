"""Data-parallel training through torchrun: 2 CPU processes (gloo) against one process with the
doubled batch. The replicas must stay bit-identical (same SHA-256 of the model state on both
ranks), the parameters must match the single-process run to float32 rounding (BatchNorm
statistics are over the global batch on both sides), only rank 0 writes the job's files, and a
run resumed mid-epoch under torchrun ends bit-identical."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from implicit_ham.training.checkpoint import read_checkpoint

ROOT = Path(__file__).resolve().parents[1]
TORCHRUN = Path(sys.executable).with_name("torchrun")
ARGS = [
    "epochs=2", "data.train_size=32", "data.val_size=8", "data.image_size=32",
    "data.num_classes=3", "context=sdpa_attention", "optim=sgd", "progress=false", "threads=1",
    "reliability.checkpoint_every=3",
]  # fmt: skip

pytestmark = pytest.mark.slow


def _env() -> dict[str, str]:
    return {**os.environ, "WANDB_MODE": "offline", "HYDRA_FULL_ERROR": "1", "OMP_NUM_THREADS": "1"}


def _run(command: list[str]) -> None:
    proc = subprocess.run(command, cwd=ROOT, env=_env(), capture_output=True, text=True,
                          timeout=600, check=False)  # fmt: skip
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]


@pytest.mark.skipif(shutil.which(str(TORCHRUN)) is None, reason="torchrun not installed")
def test_two_processes_match_one_process_with_the_doubled_batch(tmp_path: Path) -> None:
    ddp, single = tmp_path / "ddp", tmp_path / "single"
    _run([str(TORCHRUN), "--standalone", "--nproc_per_node=2", "-m", "experiments.train",
          *ARGS, "batch_size=4", f"hydra.run.dir={ddp}"])  # fmt: skip
    _run([sys.executable, "-m", "experiments.train", *ARGS, "batch_size=8",
          f"hydra.run.dir={single}"])  # fmt: skip
    results = json.loads((ddp / "results.json").read_text())
    assert results["status"] == "ok" and results["world_size"] == 2
    digests = results["state_digests"]
    assert len(digests) == 2 and digests[0] == digests[1]

    ddp_state = read_checkpoint(ddp / "checkpoint.pt")["model"]
    single_state = read_checkpoint(single / "checkpoint.pt")["model"]
    assert ddp_state.keys() == single_state.keys()
    for key, value in single_state.items():
        torch.testing.assert_close(ddp_state[key], value, rtol=1e-5, atol=1e-6, msg=key)
    reference = json.loads((single / "results.json").read_text())["metrics"]
    assert results["metrics"]["val/loss"] == pytest.approx(reference["val/loss"], rel=1e-5)
    epochs = [r for r in map(json.loads, (ddp / "metrics.jsonl").read_text().splitlines())
              if "epoch" in r]  # fmt: skip
    assert [r["epoch"] for r in epochs] == [1, 2]  # one writer: no duplicated rows
    assert sorted(p.name for p in (ddp / "checkpoints").glob("step-*.pt")) == [
        "step-000000006.pt",
        "step-000000008.pt",
    ]
    # a run that lost its last checkpoint resumes mid-epoch 2 (step 6) under torchrun
    (ddp / "results.json").unlink()
    (ddp / "checkpoints" / "step-000000008.pt").unlink()
    _run([str(TORCHRUN), "--standalone", "--nproc_per_node=2", "-m", "experiments.train",
          *ARGS, "batch_size=4", f"hydra.run.dir={ddp}"])  # fmt: skip
    assert json.loads((ddp / "results.json").read_text())["state_digests"] == digests
