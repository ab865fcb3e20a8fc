"""Point the library's warnings at the user's line.

A warning raised deep inside a solve (a solver that missed its tolerance, a backward pass at a
point that is not a fixed point) is most useful attributed to the user's call: their
``ih.fixed_point(...)``, ``model(x)`` or ``loss.backward()``. A fixed ``stacklevel`` cannot
know how deep the library's call chain is on each path (forward solve, backward pass through
autograd, a Hydra entry point), so ``user_stacklevel`` counts the frames instead.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import FrameType

import torch

_LIBRARY_DIR = Path(__file__).resolve().parents[1]  # implicit_ham/
_TORCH_DIR = Path(torch.__file__).resolve().parent  # torch/
_SKIPPED = (f"{_LIBRARY_DIR}{os.sep}", f"{_TORCH_DIR}{os.sep}")  # neither is the user's code


def user_stacklevel() -> int:
    """The ``stacklevel`` for a ``warnings.warn`` made by the caller of this function that
    points at the first frame outside this package and torch (``1``, the caller's own line,
    when every frame is one of theirs). Walks the stack once; meant for warnings, not hot
    paths."""
    frame: FrameType | None = sys._getframe(1)
    level = 1
    while frame is not None:
        if not os.path.realpath(frame.f_code.co_filename).startswith(_SKIPPED):
            return level
        frame, level = frame.f_back, level + 1
    return 1
