"""A hung peer under data parallelism (subprocesses, gloo on loopback): two training processes
started as torchrun would start them; once training runs, rank 1 is stopped with SIGSTOP.
Rank 0 must fail within the process-group timeout (``reliability.dist_timeout_s=5``) plus the
diagnosis, with ``DistributedTimeoutError`` naming rank 1, and its ``results.json`` must say
so; before the timeout existed it blocked forever."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
from helpers.train_jobs import train_command, train_env

ROOT = Path(__file__).resolve().parents[3]
ARGS = [
    "epochs=50", "data.train_size=32", "data.val_size=8", "data.image_size=32",
    "data.num_classes=3", "context=sdpa_attention", "optim=sgd", "progress=false", "threads=1",
    "batch_size=4", "log_every=1", "reliability.dist_timeout_s=5",
]  # fmt: skip
START_S, FAIL_S = 180, 90

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _train_rows(job: Path) -> int:
    metrics = job / "metrics.jsonl"
    return metrics.read_text().count('"train/loss"') if metrics.exists() else 0


def _stderr(procs: list[subprocess.Popen[str]]) -> str:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
    return "\n".join(f"rank {i}: {p.communicate()[1][-2500:]}" for i, p in enumerate(procs))


def test_a_stopped_rank_is_named_after_the_timeout(tmp_path: Path) -> None:
    port = _free_port()
    procs = []
    for rank in (0, 1):
        env = {
            **train_env(),
            **{"WORLD_SIZE": "2", "RANK": str(rank), "LOCAL_RANK": str(rank)},
            **{"LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)},
        }
        command = train_command(tmp_path, ARGS)
        procs.append(subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.PIPE, text=True))  # fmt: skip
    try:
        deadline = time.monotonic() + START_S
        while _train_rows(tmp_path) < 2:
            assert all(p.poll() is None for p in procs), _stderr(procs)
            assert time.monotonic() < deadline, "training did not start"
            time.sleep(0.01)
        os.kill(procs[1].pid, signal.SIGSTOP)
        stopped = time.monotonic()
        _, stderr = procs[0].communicate(timeout=FAIL_S)
        waited = time.monotonic() - stopped
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=30)
    assert procs[0].returncode != 0
    assert "DistributedTimeoutError" in stderr, stderr[-3000:]
    assert "rank 0 of 2" in stderr and "Ranks 1 failed to pass monitoredBarrier" in stderr
    assert "reliability.dist_timeout_s=5" in stderr
    assert waited < FAIL_S
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["status"] == "failed"
    assert results["error"].startswith("DistributedTimeoutError")
    assert "Ranks 1 failed" in results["error"]
