"""Measuring helpers: wall time with device synchronisation, and the bytes autograd saves."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field

import torch
from torch import Tensor


def synchronize(device: torch.device) -> None:
    """Wait for queued work on ``device`` (no-op on the CPU), so wall times are honest."""
    if device.type == "cpu":
        return
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None:
        accelerator.synchronize(device)
    elif device.type == "cuda":
        torch.cuda.synchronize(device)


def fork_rng_on(device: torch.device) -> AbstractContextManager[None]:
    """``torch.random.fork_rng`` for the CPU generator and, off the CPU, ``device``'s: random
    numbers drawn inside do not change the global RNG state outside."""
    devices = [] if device.type == "cpu" else [device]
    return torch.random.fork_rng(devices=devices, device_type=device.type)


@dataclass
class Stopwatch:
    """Accumulated seconds of the ``measure`` blocks run so far."""

    device: torch.device
    seconds: float = 0.0

    @contextmanager
    def measure(self) -> Iterator[None]:
        """Time the block, synchronising ``device`` before and after it."""
        synchronize(self.device)
        start = time.perf_counter()
        try:
            yield
        finally:
            synchronize(self.device)
            self.seconds += time.perf_counter() - start


@dataclass
class SavedTensorBytes:
    """Counts the bytes of the tensors autograd saves for backward inside ``track()``.

    Storages are counted once even if saved several times (deduplicated by data pointer), so
    the number approximates the activation memory the backward pass keeps alive.
    """

    total: int = 0
    _seen: set[tuple[str, int]] = field(default_factory=set)

    def _pack(self, t: Tensor) -> Tensor:
        storage = t.untyped_storage()
        key = (str(t.device), storage.data_ptr())
        if key not in self._seen:
            self._seen.add(key)
            self.total += storage.nbytes()
        return t

    @contextmanager
    def track(self) -> Iterator[None]:
        """Count what autograd saves while the block runs."""
        with torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t):
            yield
