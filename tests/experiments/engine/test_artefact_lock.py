"""A shared artefact is built once: two real processes run "load it, else build and write it"
under ``artefact_lock``. The first one's build does not finish until the test releases it, and
the test releases it only once the second process has logged that it waits on the build lock:
so the second one provably waited, then loaded what the first one built (one build for the two
jobs)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
TIMEOUT_S = 120
SCRIPT = textwrap.dedent(
    """
    import logging, os, sys, time
    logging.basicConfig(level=logging.INFO)
    from experiments.engine.artefact_lock import artefact_lock
    cache, marker, release = sys.argv[1], sys.argv[2], sys.argv[3]
    with artefact_lock(cache):
        if not os.path.exists(cache):
            with open(marker, "a") as fh:
                fh.write(f"trained by {os.getpid()}\\n")
            while not os.path.exists(release):
                time.sleep(0.01)
            with open(cache, "w") as fh:
                fh.write("accuracy=0.5")
        with open(cache) as fh:
            print(fh.read())
    """
)


def _poll(proc: subprocess.Popen[str], ready: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not ready():
        assert proc.poll() is None, f"the process ended before {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_two_jobs_build_the_classifier_cache_once(tmp_path: Path) -> None:
    cache, marker, release = tmp_path / "classifier.pt", tmp_path / "trained", tmp_path / "go"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    logs = [tmp_path / "first.log", tmp_path / "second.log"]
    procs: list[subprocess.Popen[str]] = []
    try:
        for log in logs:
            with log.open("w") as fh:
                procs.append(subprocess.Popen(
                    [sys.executable, "-c", SCRIPT, str(cache), str(marker), str(release)],
                    cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT, text=True))  # fmt: skip
            if len(procs) == 1:  # the second starts once the first holds the lock, building
                _poll(procs[0], marker.exists, "the first process started building")
        _poll(procs[1], lambda: "is being built by pid" in logs[1].read_text(), "the wait")
        assert not cache.exists()  # still being built while the second waits
        release.touch()
        for proc in procs:
            assert proc.wait(timeout=TIMEOUT_S) == 0, [log.read_text()[-2000:] for log in logs]
    finally:
        for proc in procs:
            proc.kill()
    assert marker.read_text() == f"trained by {procs[0].pid}\n"  # one build for the two jobs
    outputs = [log.read_text() for log in logs]
    assert [out.strip().splitlines()[-1] for out in outputs] == ["accuracy=0.5"] * 2
    assert f"is being built by pid {procs[0].pid}; waiting for it" in outputs[1]
    assert cache.exists()
