"""Reproducibility: capture and restore the random number generators a training run draws
from, and switch on deterministic algorithms.

Python's ``random``, numpy's global generator, torch's CPU generator and (when initialised) every
CUDA generator. The captured state holds only tensors, ints, floats, strings and tuples, so a
checkpoint containing it loads with ``torch.load(..., weights_only=True)``.
"""

from __future__ import annotations

import random
from typing import Any, cast

import numpy as np
import torch

RngState = dict[str, Any]


def capture_rng_state() -> RngState:
    """The current state of every generator (see the module docstring)."""
    kind, keys, pos, has_gauss, gauss = cast(tuple[Any, ...], np.random.get_state())
    state: RngState = {
        "python": random.getstate(),
        "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: RngState) -> None:
    """Set every generator to ``state`` (from ``capture_rng_state``, possibly via a
    checkpoint). CUDA states are restored when present and CUDA is available."""
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])

