"""Sinks: JSONL round trip, CSV with keys appearing later, wandb offline, fan-out."""

from __future__ import annotations

import csv
import errno
import json
import math
import time
from pathlib import Path

import pytest
import torch

from experiments.engine.file_sinks import CSVSink, JSONLSink, read_jsonl
from experiments.engine.results import write_results
from experiments.engine.wandb_sink import WandbSink, resolve_mode, resolved_config
from implicit_ham._core.sinks import MultiSink, Sink, plain_value


def test_jsonl_rows_parse_and_round_trip(tmp_path) -> None:
    metrics = [
        {"loss": 0.25, "ok": True, "name": "run", "none": None, "count": 3},
        {"loss": float("nan"), "inf": float("inf"), "tensor": torch.tensor(1.5)},
    ]
    table = [{"adjoint": "unroll", "cosine": 1.0}, {"adjoint": "one_step", "extra": 2}]
    with JSONLSink(tmp_path) as sink:
        sink.log(metrics[0], step=0)
        sink.log(metrics[1], step=7)
        sink.log_table("fidelity/at start", table, step=7)
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert rows[0] == {"step": 0, **metrics[0]}
    assert rows[1]["step"] == 7 and math.isnan(rows[1]["loss"]) and rows[1]["inf"] == math.inf
    assert rows[1]["tensor"] == 1.5 and isinstance(rows[1]["tensor"], float)
    assert read_jsonl(tmp_path / "tables" / "fidelity__at_start.jsonl") == [
        {"step": 7, **r} for r in table
    ]


def test_csv_handles_keys_appearing_later(tmp_path) -> None:
    sink = CSVSink(tmp_path)
    sink.log({"loss": 1.0}, step=0)
    sink.log({"loss": 0.5, "grad_norm/global": 3.0}, step=1)
    sink.log({"cond/kappa": 1e8}, step=2)
    sink.close()
    with open(tmp_path / "metrics.csv", newline="") as fh:
        reader = csv.DictReader(fh)
        rows = list(reader)
        assert reader.fieldnames == ["step", "loss", "grad_norm/global", "cond/kappa"]
    assert rows == [
        {"step": "0", "loss": "1.0", "grad_norm/global": "", "cond/kappa": ""},
        {"step": "1", "loss": "0.5", "grad_norm/global": "3.0", "cond/kappa": ""},
        {"step": "2", "loss": "", "grad_norm/global": "", "cond/kappa": "100000000.0"},
    ]
    again = CSVSink(tmp_path)  # continuing an existing file keeps its header
    again.log({"loss": 0.1, "new": "x"}, step=3)
    with open(tmp_path / "metrics.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 4 and rows[0]["new"] == "" and rows[3]["new"] == "x"


def test_wandb_offline_run_contains_logged_keys(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    config = {"model": {"rank": 8}, "adjoint": "one_step"}
    sink = WandbSink("ih-test", group="sweep-a", tags=["diag"], config=config, dir=tmp_path)
    sink.log({"grad_norm/global": 2.5, "cond/layer/kappa": torch.tensor(12.0)}, step=1)
    sink.log_table("fidelity", [{"adjoint": "unroll", "cosine": 1.0}], step=2)
    sink.close()
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    log_file = next(runs[0].glob("run-*.wandb"))
    keys = (b"grad_norm/global", b"cond/layer/kappa", b"fidelity", b"rank", b"sweep-a")
    # wandb's service process may finish writing the run file shortly after finish() returns
    deadline = time.monotonic() + 60
    while not all(k in log_file.read_bytes() for k in keys) and time.monotonic() < deadline:
        time.sleep(0.2)
    data = log_file.read_bytes()
    assert [k for k in keys if k not in data] == []


def test_wandb_mode_resolution(monkeypatch) -> None:
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    assert resolve_mode(None) == "offline"
    assert resolve_mode("disabled") == "disabled"
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    assert resolve_mode(None) is None  # wandb's own default (online) with a key
    monkeypatch.delenv("WANDB_API_KEY")
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert resolve_mode(None) is None  # respect the environment
    assert resolve_mode("online") == "online"  # an explicit mode wins over the environment
    with pytest.raises(ValueError, match=r"'ofline'.*online, offline, disabled, shared"):
        resolve_mode("ofline")  # refused before wandb starts


def test_resolved_config_evaluates_interpolations() -> None:
    from omegaconf import OmegaConf

    cfg = OmegaConf.create({"rank": 8, "model": {"width": "${rank}"}})
    assert resolved_config(cfg) == {"rank": 8, "model": {"width": 8}}
    with pytest.raises(TypeError, match="mapping or an OmegaConf"):
        resolved_config([1, 2])


class _Recorder(Sink):
    def __init__(self, fail_close: bool = False) -> None:
        self.calls: list[tuple] = []
        self.fail_close = fail_close

    def log(self, metrics, step) -> None:
        self.calls.append(("log", dict(metrics), step))

    def log_table(self, name, rows, step=None) -> None:
        self.calls.append(("table", name, list(rows), step))

    def close(self) -> None:
        self.calls.append(("close",))
        if self.fail_close:
            raise OSError("disk full")


def test_multisink_fans_out_and_closes_every_sink() -> None:
    a, b = _Recorder(fail_close=True), _Recorder()
    multi = MultiSink([a, b])
    multi.log({"x": 1}, step=3)
    multi.log_table("t", [{"y": 2}])
    with pytest.raises(OSError, match="disk full"):
        multi.close()
    for rec in (a, b):
        assert rec.calls == [("log", {"x": 1}, 3), ("table", "t", [{"y": 2}], None), ("close",)]


def test_plain_value_rejects_non_scalars_with_the_fix() -> None:
    with pytest.raises(TypeError, match="its mean or norm"):
        plain_value(torch.ones(3), "weights")
    with pytest.raises(TypeError, match="log a number or a string"):
        plain_value(object(), "thing")
    assert plain_value(torch.tensor([2])) == 2


class _FullDisk:
    """A file object whose writes fail as on a full disk (ENOSPC, no file name)."""

    name = "unused"

    def write(self, text: str) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


def test_a_full_disk_error_names_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 47 item 10: ENOSPC on a write of an open file has no file name; the engine's
    writers re-raise it naming the file (what a failed job's results.json then records)."""
    sink = JSONLSink(tmp_path)
    sink.log({"loss": 1.0}, 0)
    handle = sink._files["metrics.jsonl"]
    full = _FullDisk()
    full.name = handle.fh.name
    handle.fh.close()
    handle.fh = full  # type: ignore[assignment]
    with pytest.raises(OSError, match=r"No space left on device: '.*metrics\.jsonl'") as err:
        sink.log({"loss": 2.0}, 1)
    assert err.value.errno == errno.ENOSPC
    monkeypatch.setattr(json, "dump", lambda *a, **k: _FullDisk().write(""))
    with pytest.raises(OSError, match=r"No space left on device: '.*results\.json'"):
        write_results(tmp_path, {"status": "ok"})
