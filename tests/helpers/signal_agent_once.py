"""``torchrun ... tests/helpers/signal_agent_once.py JOB_DIR STEP [train overrides]``: the
training job of ``experiments.train`` in ``JOB_DIR``, whose rank 1 sends SIGTERM to its torchrun
agent (its parent process, as a scheduler's preemption signal to the launcher would) once the
checkpoint of step STEP is complete, on the first run only (``JOB_DIR/signalled`` absent). It
writes ``JOB_DIR/signalled`` first, so that a test can tell the signal was sent. The agent
forwards the signal to every worker."""

from __future__ import annotations

import os
import runpy
import signal
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _signal_after(job: Path, step: int) -> None:
    digest = job / "checkpoints" / f"step-{step:09d}.pt.sha256"
    while not digest.exists():
        time.sleep(0.005)
    (job / "signalled").write_text(f"rank 1 sent SIGTERM to the agent after step {step}\n")
    os.kill(os.getppid(), signal.SIGTERM)


def main() -> None:
    job, step = Path(sys.argv[1]), int(sys.argv[2])
    if os.environ.get("RANK") == "1" and not (job / "signalled").exists():
        threading.Thread(target=_signal_after, args=(job, step), daemon=True).start()
    sys.path.insert(0, str(ROOT))
    sys.argv = ["experiments.train", *sys.argv[3:], f"hydra.run.dir={job}"]
    runpy.run_module("experiments.train", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
