"""A job's files follow the umask (lab-mates in the group can read them): results, checkpoints
and their digests, the metric and failure logs, Hydra's run log and the job lock, written by a
real ``experiments.train`` subprocess under umask 022 (0644) and 027 (0640)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from helpers.train_jobs import ROOT, train_command, train_env

ARGS = [
    "epochs=1", "data.train_size=16", "data.val_size=8", "data.image_size=48",
    "data.num_classes=3", "context.rank=4", "context.steps=3", "context.eval_steps=3",
    "batch_size=8", "progress=false", "threads=1", "adjoint=implicit",
]  # fmt: skip
FILES = (
    "results.json", "checkpoint.pt", "checkpoint.pt.sha256", "metrics.csv", "metrics.jsonl",
    "tables/failures.jsonl", "tables/failures.csv", "train.log", ".lock",
    "checkpoints/step-000000002.pt", "checkpoints/step-000000002.pt.sha256",
)  # fmt: skip

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o027, 0o640)])
def test_job_files_follow_the_umask(tmp_path: Path, umask: int, mode: int) -> None:
    proc = subprocess.run(train_command(tmp_path, ARGS), cwd=ROOT, env=train_env(),
                          capture_output=True, text=True, timeout=240, check=False,
                          umask=umask)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    modes = {name: (tmp_path / name).stat().st_mode & 0o777 for name in FILES}
    assert modes == dict.fromkeys(FILES, mode), {k: oct(v) for k, v in modes.items()}
