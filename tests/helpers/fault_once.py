"""``torchrun ... tests/helpers/fault_once.py FAULT JOB_DIR STEP [train overrides]``: the
training job of ``experiments.train`` in ``JOB_DIR``, whose rank 1 injects FAULT once the
checkpoint of step STEP is complete (its digest file exists), on the first run only:

* ``crash``: rank 1 dies (``os._exit(1)``, as a crashed worker would) on the first attempt
  (``TORCHELASTIC_RESTART_COUNT=0``); it writes ``JOB_DIR/crashed`` first.
* ``sigterm``: rank 1 sends SIGTERM to its torchrun agent (its parent process, as a scheduler's
  preemption signal to the launcher would), which forwards it to every worker; unless
  ``JOB_DIR/signalled`` exists, which it writes first.

The marker file tells a test the fault happened; later runs train the job unchanged."""

from __future__ import annotations

import os
import runpy
import signal
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MARKERS = {"crash": "crashed", "sigterm": "signalled"}


def _inject_after(fault: str, job: Path, step: int) -> None:
    digest = job / "checkpoints" / f"step-{step:09d}.pt.sha256"
    while not digest.exists():
        time.sleep(0.005)
    (job / MARKERS[fault]).write_text(f"rank 1: {fault} after the checkpoint of step {step}\n")
    if fault == "crash":
        os._exit(1)
    os.kill(os.getppid(), signal.SIGTERM)


def _first_run(fault: str, job: Path) -> bool:
    if fault == "crash":
        return os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    return not (job / MARKERS[fault]).exists()


def main() -> None:
    fault, job, step = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
    if fault not in MARKERS:
        raise SystemExit(f"fault_once.py: FAULT must be one of {sorted(MARKERS)}, got {fault!r}")
    if os.environ.get("RANK") == "1" and _first_run(fault, job):
        threading.Thread(target=_inject_after, args=(fault, job, step), daemon=True).start()
    sys.path.insert(0, str(ROOT))
    sys.argv = ["experiments.train", *sys.argv[4:], f"hydra.run.dir={job}"]
    runpy.run_module("experiments.train", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
