"""``torchrun ... tests/helpers/crash_once.py JOB_DIR STEP [train overrides]``: the training job
of ``experiments.train`` in ``JOB_DIR``, whose rank 1 dies (``os._exit(1)``, as a crashed worker
would) on the first attempt (``TORCHELASTIC_RESTART_COUNT=0``) once the checkpoint of step STEP
is complete (its digest file exists). It writes ``JOB_DIR/crashed`` first, so that a test can
tell the crash happened. Later attempts run the job unchanged."""

from __future__ import annotations

import os
import runpy
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _crash_after(job: Path, step: int) -> None:
    digest = job / "checkpoints" / f"step-{step:09d}.pt.sha256"
    while not digest.exists():
        time.sleep(0.005)
    (job / "crashed").write_text(f"rank 1 crashed after the checkpoint of step {step}\n")
    os._exit(1)


def main() -> None:
    job, step = Path(sys.argv[1]), int(sys.argv[2])
    first = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    if first and os.environ.get("RANK") == "1":
        threading.Thread(target=_crash_after, args=(job, step), daemon=True).start()
    sys.path.insert(0, str(ROOT))
    sys.argv = ["experiments.train", *sys.argv[3:], f"hydra.run.dir={job}"]
    runpy.run_module("experiments.train", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
