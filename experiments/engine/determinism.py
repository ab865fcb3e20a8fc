"""Reproducibility: capture and restore the random number generators a training run draws
from, and switch on deterministic algorithms.

Python's ``random``, numpy's global generator, torch's CPU generator and (when initialised) every
CUDA generator. The captured state holds only tensors, ints, floats, strings and tuples, so a
checkpoint containing it loads with ``torch.load(..., weights_only=True)``.
"""

from __future__ import annotations

import os

import torch


def configure_determinism(enabled: bool, device: torch.device) -> None:
    """Turn torch's deterministic algorithms on (or off) for this process.

    On: ``torch.use_deterministic_algorithms(True, warn_only=True)`` (an operation without a
    deterministic implementation warns instead of failing), cuDNN benchmarking off, and on CUDA
    ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` unless already set (it must be set before cuBLAS starts).
    """
    if enabled and device.type == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(enabled, warn_only=True)
    torch.backends.cudnn.benchmark = not enabled and torch.backends.cudnn.benchmark

