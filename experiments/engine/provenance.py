"""Where a job or a study row was computed: the processor model, torch's thread count, the
library commit and the torch version (in every training job's ``results.json`` as ``host``, and
columns of the studies' CSVs), so results from different machines or versions can be told apart
and a drift between them measured."""

from __future__ import annotations

import platform
import subprocess
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
# the code a row depends on: a change here without a commit marks the row "+dirty"
CODE_PATHS = ("implicit_ham", "experiments", "conf")


def cpu_model() -> str:
    """The processor's model name (``/proc/cpuinfo``; else ``platform.processor()``; else
    "unknown")."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("model name"):
                return " ".join(line.split(":", 1)[1].split())
    return platform.processor() or "unknown"


def library_commit(repo: Path = REPO) -> str:
    """The repository's HEAD commit (12 hex digits), "+dirty" when the library, experiments or
    configs differ from it; "unknown" outside a git checkout."""
    try:
        head = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "--short=12", "HEAD"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        dirty = subprocess.run(
            ["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no", "--",
             *CODE_PATHS], capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def host() -> dict[str, str]:
    """``cpu``, ``commit`` and ``torch`` (a training job's ``results.json`` records its threads
    apart)."""
    return {"cpu": cpu_model(), "commit": library_commit(), "torch": torch.__version__}


def provenance() -> dict[str, str | int]:
    """``host()`` and ``threads`` (``torch.get_num_threads()`` now): a study row's columns."""
    return {**host(), "threads": torch.get_num_threads()}
