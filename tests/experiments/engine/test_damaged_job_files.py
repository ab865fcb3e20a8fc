"""Issue 47 items 4-6: damage to a job's files is told apart from a read error and never
accepted silently.

* item 4: a checkpoint that cannot be read (an ``OSError``, e.g. EACCES) is not corrupt: the
  run stops naming the file and the error, nothing is moved aside, no metric file deleted.
* item 5: a checkpoint without its digest file is checked by its zip CRC-32s (``torch.load``
  ignores them): a flipped byte is refused and the store falls back to the previous one.
* item 6: metric files shorter than the checkpoint recorded (rows cut, a table deleted, a CSV
  without its header) refuse the resume, naming the file and the counts.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from experiments.config.groups import TrainConfig, register_configs
from experiments.config.typed import typed_config
from experiments.engine.checkpoint import (
    CheckpointError,
    CheckpointStore,
    CheckpointUnreadableError,
    read_checkpoint,
    sidecar,
)
from experiments.engine.resume import CHECKPOINT_DIR, ResumeLogError
from experiments.engine.run import run_training

CONF = Path(__file__).resolve().parents[3] / "conf"
TINY = [
    "epochs=2", "data.train_size=16", "data.val_size=8", "data.image_size=32",
    "data.num_classes=2", "context.rank=2", "context.steps=2", "context.eval_steps=2",
    "batch_size=8", "progress=false", "threads=1", "diagnostics.enabled=false",
    "adjoint=implicit", "adjoint.max_steps=1", "adjoint.tol=1e-12", "log_every=1",
    "reliability.keep=3", "logger=files",
]  # fmt: skip


def _config(*overrides: str) -> TrainConfig:
    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return typed_config(compose("config", overrides=[*TINY, *overrides]), TrainConfig)


def _hashes(job: Path) -> dict[str, str]:
    return {
        str(p.relative_to(job)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(job.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    job = tmp_path_factory.mktemp("job") / "job"
    threads = torch.get_num_threads()
    try:
        run_training(_config(), job)
    finally:
        torch.set_num_threads(threads)
    return job


def _unfinished(finished: Path, to: Path) -> Path:
    """A copy of the finished job that stopped after its epoch-1 checkpoint (step 2), with
    the rows of epoch 2 still in its logs (as after a crash)."""
    job = shutil.copytree(finished, to)
    (job / "results.json").unlink()
    (job / "checkpoint.pt").unlink()
    newest = sorted((job / CHECKPOINT_DIR).glob("step-*.pt"))[-1]
    assert newest.name == "step-000000004.pt"
    newest.unlink()
    sidecar(newest).unlink()
    return job


def _flip_tensor_byte(path: Path, tensor: torch.Tensor) -> None:
    raw = bytearray(path.read_bytes())
    at = bytes(raw).index(tensor.numpy().tobytes())
    raw[at + 5] ^= 0x01  # one bit of one float: a loadable file, 4.5e-7-style off weights
    path.write_bytes(bytes(raw))


def test_checkpoint_without_digest_is_checked_by_its_zip_crcs(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep=2)
    weights = torch.linspace(0, 1, 64, dtype=torch.float64)
    for step in (1, 2):
        store.save(step, {"weights": weights + step})
    newest = store.paths()[-1]
    sidecar(newest).unlink()  # a crash between the checkpoint's rename and its digest's
    assert torch.equal(read_checkpoint(newest)["weights"], weights + 2)  # intact: loads
    _flip_tensor_byte(newest, weights + 2)
    with pytest.raises(CheckpointError, match=r"step-000000002\.pt \(no digest file\) is corr"):
        read_checkpoint(newest)
    path, payload = store.latest()  # falls back to the previous one
    assert path.name == "step-000000001.pt" and torch.equal(payload["weights"], weights + 1)
    assert (tmp_path / "step-000000002.pt.corrupt").exists()
    foreign = tmp_path / "foreign.pt"
    foreign.write_bytes(b"PK\x03\x04 not a zip")
    with pytest.raises(CheckpointError, match=r"foreign\.pt \(no digest file\) is not an intact"):
        read_checkpoint(foreign)


def _unreadable(monkeypatch: pytest.MonkeyPatch, target: Path) -> None:
    """``target`` raises EACCES when read (the tests run as root, where chmod 000 would not)."""
    read_bytes = Path.read_bytes

    def refusing(self: Path) -> bytes:
        if self == target:
            raise PermissionError(13, "Permission denied", str(self))
        return read_bytes(self)

    monkeypatch.setattr(Path, "read_bytes", refusing)


def test_unreadable_checkpoint_stops_the_run_and_touches_nothing(
    finished: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EACCES on an intact checkpoint: the run stops naming the file and the error; nothing
    is renamed .corrupt, no metric file deleted, results.json unchanged (item 4: the old code
    moved it aside, deleted the logs and restarted from scratch)."""
    for name, job in (("finished", tmp_path / "a"), ("unfinished", tmp_path / "b")):
        job = shutil.copytree(finished, job) if name == "finished" else _unfinished(finished, job)
        newest = sorted((job / CHECKPOINT_DIR).glob("step-*.pt"))[-1]
        before = _hashes(job)
        with monkeypatch.context() as patch:
            _unreadable(patch, newest)
            with pytest.raises(CheckpointUnreadableError, match="Permission denied") as err:
                run_training(_config(), job)
        assert str(newest) in str(err.value)
        assert _hashes(job) == before, name


@pytest.mark.parametrize("damage", ["cut_rows", "tables_deleted", "csv_header_lost"])
def test_logs_shorter_than_the_checkpoint_refuse_the_resume(
    finished: Path, tmp_path: Path, damage: str
) -> None:
    job = _unfinished(finished, tmp_path / "job")
    metrics = job / "metrics.jsonl"
    if damage == "cut_rows":
        lines = metrics.read_text().splitlines(keepends=True)
        metrics.write_text("".join(lines[:2]))  # the checkpoint of step 2 recorded 3 rows
        expected = r"metrics\.jsonl has 2 of the 3 rows"
    elif damage == "tables_deleted":
        for table in (job / "tables").glob("failures.*"):
            table.unlink()
        expected = r"tables/failures\.csv has 0 of the \d+ rows the checkpoint recorded \(the"
    else:
        csv_file = job / "metrics.csv"
        csv_file.write_text("".join(csv_file.read_text().splitlines(keepends=True)[1:]))
        expected = r"metrics\.csv .*"
    kept = {p: p.read_bytes() for p in job.rglob("*") if p.is_file() and p.suffix != ".json"}
    with pytest.raises(ResumeLogError, match=expected):
        run_training(_config(), job)
    # nothing cut or rebuilt: the files are as they were
    assert {p: p.read_bytes() for p in kept} == kept
