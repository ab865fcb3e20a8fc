"""Checkpoint files (atomic write, corruption detection, rotation), RNG capture, the resumable
epoch sampler, metric-file rewinding and the train state."""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import random
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from experiments.engine.checkpoint import (
    CheckpointError,
    CheckpointStore,
    read_checkpoint,
    sidecar,
    write_checkpoint,
)
from experiments.engine.file_sinks import CSVSink, JSONLSink
from experiments.engine.results import ResultsError, read_results, write_results
from experiments.engine.resume import comparable_config, config_differences, log_rows, rewind_logs
from experiments.engine.sampler import EpochBatchSampler
from experiments.engine.state import TrainState
from implicit_ham.reliability.rng import capture_rng_state, restore_rng_state


def _payload(value: float = 1.0) -> dict:
    return {"weights": torch.full((3, 2), value), "step": 5, "name": "x", "nested": [1, (2.5,)]}


def test_round_trip(tmp_path: Path) -> None:
    path = write_checkpoint(tmp_path / "c.pt", _payload())
    loaded = read_checkpoint(path)
    assert torch.equal(loaded["weights"], torch.ones(3, 2))
    assert loaded["nested"] == [1, (2.5,)] and loaded["step"] == 5
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.pt", "c.pt.sha256"]
    plain = torch.load(path, weights_only=True)  # another codebase needs no reader of ours
    assert torch.equal(plain["weights"], loaded["weights"]) and plain["nested"] == [1, (2.5,)]


def test_files_follow_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        path = write_checkpoint(tmp_path / "c.pt", _payload())
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o644
    assert sidecar(path).stat().st_mode & 0o777 == 0o644


def test_truncated_corrupted_and_foreign_files_are_named(tmp_path: Path) -> None:
    path = write_checkpoint(tmp_path / "c.pt", _payload())
    raw = path.read_bytes()
    path.write_bytes(raw[:-10])
    with pytest.raises(CheckpointError, match=r"c\.pt is truncated"):
        read_checkpoint(path)
    flipped = bytearray(raw)
    flipped[-20] ^= 0xFF
    path.write_bytes(bytes(flipped))
    with pytest.raises(CheckpointError, match=r"c\.pt is corrupted"):
        read_checkpoint(path)
    path.write_bytes(raw)
    sidecar(path).write_text("garbage")
    with pytest.raises(CheckpointError, match=r"digest file of .*c\.pt is damaged"):
        read_checkpoint(path)
    sidecar(path).unlink()  # without a digest: checked by its zip CRCs (intact here)
    assert torch.equal(read_checkpoint(path)["weights"], torch.ones(3, 2))
    path.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match=r"c\.pt \(no digest file\) is not an intact zip"):
        read_checkpoint(path)


def test_crafted_pickle_is_refused_as_a_checkpoint_error_naming_the_file(tmp_path: Path) -> None:
    class Payload:
        def __reduce__(self) -> tuple:
            return (os.system, ("touch " + str(tmp_path / "pwned"),))

    path = tmp_path / "step-000000003.pt"
    torch.save({"model": Payload()}, path)  # a valid torch file whose unpickling runs code
    with pytest.raises(CheckpointError, match=r"step-000000003\.pt is not a loadable"):
        read_checkpoint(path)
    assert not (tmp_path / "pwned").exists()
    store = CheckpointStore(tmp_path)
    with pytest.raises(CheckpointError, match="no usable checkpoint"):
        store.latest()
    assert (tmp_path / "step-000000003.pt.corrupt").exists()  # moved aside


def test_older_header_format_is_still_read_and_verified(tmp_path: Path) -> None:
    buffer = io.BytesIO()
    torch.save(_payload(), buffer)
    data = buffer.getvalue()
    header = f"implicit-ham-checkpoint v1 sha256={hashlib.sha256(data).hexdigest()} "
    path = tmp_path / "old.pt"
    path.write_bytes(header.encode() + f"bytes={len(data)}\n".encode() + data)
    assert torch.equal(read_checkpoint(path)["weights"], torch.ones(3, 2))
    path.write_bytes(path.read_bytes()[:-5])
    with pytest.raises(CheckpointError, match=r"old\.pt is truncated"):
        read_checkpoint(path)


def test_interrupted_write_keeps_the_previous_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_checkpoint(tmp_path / "c.pt", _payload(1.0))

    def crash(*_: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(KeyboardInterrupt):
        write_checkpoint(path, _payload(2.0))
    monkeypatch.undo()
    assert torch.equal(read_checkpoint(path)["weights"], torch.ones(3, 2))


def test_store_keeps_the_newest_and_falls_back_past_a_bad_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = CheckpointStore(tmp_path, keep=2)
    for step in (3, 6, 9):
        store.save(step, _payload(float(step)))
    assert [p.name for p in store.paths()] == ["step-000000006.pt", "step-000000009.pt"]
    newest = store.paths()[-1]
    newest.write_bytes(newest.read_bytes()[:100])
    host = socket.gethostname()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True, timeout=60)  # fmt: skip
    own = f"step-000000012.pt.{host}-{os.getpid()}.abc123.tmp"
    of_dead = f"step-000000012.pt.{host}-{int(dead.stdout)}.def456.tmp"
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        of_live = f"step-000000012.pt.{host}-{live.pid}.ghi789.tmp"
        for name in (own, of_dead, of_live, "foreign.tmp"):
            (tmp_path / name).write_bytes(b"partial")
        with caplog.at_level(logging.ERROR):
            path, payload = store.latest()
    finally:
        live.kill()
        live.wait(timeout=60)
    assert path.name == "step-000000006.pt" and float(payload["weights"][0, 0]) == 6.0
    assert "step-000000009.pt is truncated" in caplog.text
    # only this process's and a dead writer's partial files are removed
    kept = ["foreign.tmp", of_live, "step-000000006.pt", "step-000000006.pt.sha256"]
    aside = ["step-000000009.pt.corrupt", "step-000000009.pt.corrupt.sha256"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*kept, *aside])
    path.write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match=r"step-000000006\.pt"):
        store.latest()
    assert CheckpointStore(tmp_path / "empty").latest() is None


def test_rng_state_round_trip_through_a_checkpoint(tmp_path: Path) -> None:
    torch.manual_seed(3)
    np.random.seed(3)
    random.seed(3)
    np.random.normal()  # leaves a cached gaussian in numpy's state
    write_checkpoint(tmp_path / "r.pt", {"rng": capture_rng_state()})
    expected = (torch.rand(4), np.random.normal(size=3), random.random())
    torch.manual_seed(99)
    np.random.seed(99)
    random.seed(99)
    restore_rng_state(read_checkpoint(tmp_path / "r.pt")["rng"])
    assert torch.equal(torch.rand(4), expected[0])
    assert np.array_equal(np.random.normal(size=3), expected[1])
    assert random.random() == expected[2]


def test_sampler_order_depends_only_on_seed_and_epoch() -> None:
    a = EpochBatchSampler(10, 3, seed=5)
    b = EpochBatchSampler(10, 3, seed=5)
    a.set_position(2)
    first = list(a)
    b.set_position(1)
    list(b)
    b.set_position(2)
    assert list(b) == first
    assert sorted(i for batch in first for i in batch) == list(range(10))
    assert [len(batch) for batch in first] == [3, 3, 3, 1]
    b.set_position(1)
    assert list(b) != first
    a.set_position(2, batch=2)
    assert len(a) == 2 and list(a) == first[2:]
    with pytest.raises(ValueError, match="batch=5"):
        a.set_position(2, batch=5)


def test_sampler_shards_are_the_halves_of_the_doubled_batch() -> None:
    single = EpochBatchSampler(11, 4, seed=1)
    ranks = [EpochBatchSampler(11, 2, seed=1, rank=r, world_size=2) for r in range(2)]
    for sampler in (single, *ranks):
        sampler.set_position(3)
    merged = [r0 + r1 for r0, r1 in zip(*(list(s) for s in ranks), strict=True)]
    assert merged == list(single)
    tiny = [EpochBatchSampler(9, 4, seed=1, rank=r, world_size=2) for r in range(2)]
    assert [len(s) for s in tiny] == [1, 1]  # the last global batch (1 sample) is dropped
    with pytest.raises(ValueError, match="rank=2"):
        EpochBatchSampler(8, 2, seed=0, rank=2, world_size=2)


def test_metric_files_are_rewound_to_a_checkpoint(tmp_path: Path) -> None:
    sinks = [JSONLSink(tmp_path), CSVSink(tmp_path)]
    for step in range(3):
        for sink in sinks:
            sink.log({"loss": float(step)}, step)
    rows = log_rows(tmp_path)
    assert rows == {"metrics.jsonl": 3, "metrics.csv": 3}
    for step in range(3, 5):
        for sink in sinks:
            sink.log({"loss": float(step), "new": 1.0}, step)
            sink.log_table("failures", [{"kind": "x"}], step)
    for sink in sinks:
        sink.close()
    rewind_logs(tmp_path, rows)
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [0, 1, 2]
    csv_lines = (tmp_path / "metrics.csv").read_text().splitlines()
    assert csv_lines[0].split(",")[:2] == ["step", "loss"] and len(csv_lines) == 4
    assert not list((tmp_path / "tables").iterdir())


def test_train_state_tracks_the_best_epoch_and_round_trips() -> None:
    state = TrainState(step=4, batch=4, loss_sum=2.0, loss_count=4)
    state.finish_epoch({"val/loss": 0.5})
    state.finish_epoch({"val/loss": 0.7})
    assert state.best == {"val/loss": 0.5, "epoch": 1}
    assert (state.epoch, state.batch, state.loss_count, state.step) == (3, 0, 0, 4)
    assert TrainState.from_state_dict(state.state_dict()) == state


def test_config_differences_name_dotted_keys() -> None:
    old = {"seed": 0, "optim": {"lr": 0.1, "momentum": 0.9}}
    new = {"seed": 0, "optim": {"lr": 0.2, "momentum": 0.9}, "epochs": 3}
    assert config_differences(old, new) == ["epochs", "optim.lr"]


def test_default_dtype_matches_checkpoints_written_before_the_option() -> None:
    before = {"seed": 0, "threads": 1}  # a config saved before ``dtype`` existed
    assert not config_differences(comparable_config(before), comparable_config(
        {"seed": 0, "threads": 2, "dtype": "float32"}))  # fmt: skip
    assert config_differences(
        comparable_config(before), comparable_config({"seed": 0, "dtype": "float64"})
    ) == ["dtype"]


def test_results_follow_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        path = write_results(tmp_path, {"status": "ok"})
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o644


@pytest.mark.parametrize("content", ['{"status": "ok", "metr', "[1, 2]", "\xff\xfe"])
def test_garbled_results_name_the_file(tmp_path: Path, content: str) -> None:
    (tmp_path / "results.json").write_bytes(content.encode("latin-1"))
    with pytest.raises(ResultsError, match=r"results\.json .*Delete it"):
        read_results(tmp_path)
    write_results(tmp_path, {"status": "ok", "loss": float("nan")})
    assert read_results(tmp_path) == {"status": "ok", "loss": None}
