"""Measuring a training or inference step: latency, FLOPs, saved-activation bytes, peak memory.

Shared by ``experiments/benchmarks/blocks.py`` and ``experiments/benchmarks/adjoints.py``. Every
measurement runs
the step itself (nothing is estimated):

* time: ``interleaved_medians`` runs every case once per round, round after round, so machine
  noise (other jobs on a shared host) hits every case alike; the clock is the wall clock
  (with device synchronisation) or the process CPU time (``clock="cpu"``, the stable choice on
  a shared CPU host with one thread: it does not count the time other jobs hold the core);
* FLOPs: ``torch.utils.flop_counter.FlopCounterMode`` (matmuls, convolutions, attention; it
  ignores elementwise work), taught the CPU flash-attention kernels it does not know;
* saved bytes: every tensor autograd saves for backward passes through
  ``torch.autograd.graph.saved_tensors_hooks``; distinct storages are summed (parameters
  saved by a layer count too);
* peak bytes: the allocator's peak during the step above its level at the start: on an
  accelerator ``torch.accelerator.max_memory_allocated``; on the CPU the allocation and free
  events the PyTorch profiler records with ``profile_memory=True`` (every tensor allocation
  through PyTorch's CPU allocator, replayed in time order; a block allocated before the window
  and freed inside it is not seen, so the number is the peak of what the step allocated, and
  PyTorch logs "Memory block of unknown size was allocated before the profiling started").
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import TypeVar

import torch
from torch import Tensor
from torch.profiler import ProfilerActivity, profile
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

from implicit_ham.diagnostics.measure import SavedTensorBytes, synchronize

Key = TypeVar("Key", bound=Hashable)

MIB = 2.0**20
Size = torch.Size
CLOCKS = ("wall", "cpu")


@dataclass(frozen=True)
class Step:
    """A measurable step: ``loss()`` runs the forward pass and returns a scalar to backprop;
    ``reset()`` drops accumulated gradients (before every training step); ``infer()`` runs
    the forward pass without autograd."""

    loss: Callable[[], Tensor]
    reset: Callable[[], None]
    infer: Callable[[], object]

    def forward_backward(self) -> None:
        """Forward and backward (gradients accumulate onto existing ones)."""
        self.loss().backward()

    def train(self) -> None:
        """One training step: reset gradients, forward, backward."""
        self.reset()
        self.forward_backward()

    def train_peak_bytes(self, device: torch.device) -> int | None:
        """``peak_bytes`` of one training step (gradients reset before the measured window)."""
        self.reset()
        return peak_bytes(self.forward_backward, device)


def clock_seconds(clock: str) -> Callable[[], float]:
    """The clock: "wall" (``time.perf_counter``) or "cpu" (``time.process_time``)."""
    if clock not in CLOCKS:
        raise ValueError(f"unknown clock {clock!r}; choose one of {', '.join(CLOCKS)}")
    return time.perf_counter if clock == "wall" else time.process_time


def interleaved_medians(
    cases: Mapping[Key, Callable[[], object]],
    device: torch.device,
    repeats: int,
    warmup: int,
    clock: str = "wall",
) -> dict[Key, float]:
    """Median milliseconds of each case over ``repeats`` rounds after ``warmup`` rounds; in a
    round every case runs once, in order. Results are keyed as ``cases``."""
    if clock == "cpu" and device.type != "cpu":
        raise ValueError(
            f"clock='cpu' measures host CPU time, not work on {device}; use clock='wall' there"
        )
    samples = interleaved_samples(cases, device, repeats, warmup, clock_seconds(clock))
    return {name: statistics.median(values) for name, values in samples.items()}


def interleaved_samples(
    cases: Mapping[Key, Callable[[], object]],
    device: torch.device,
    repeats: int,
    warmup: int,
    now: Callable[[], float],
) -> dict[Key, list[float]]:
    """Milliseconds (by the clock ``now``) of each case in each of ``repeats`` rounds after
    ``warmup`` untimed rounds; in a round every case runs once, in order, the device
    synchronised before and after it. Keyed as ``cases``, in round order."""
    samples: dict[Key, list[float]] = {name: [] for name in cases}
    for round_index in range(warmup + repeats):
        for name, case in cases.items():
            synchronize(device)
            start = now()
            case()
            synchronize(device)
            if round_index >= warmup:
                samples[name].append((now() - start) * 1e3)
    return samples


def _cpu_flash_flops(query: Size, key: Size, value: Size, *_: object, **__: object) -> int:
    return sdpa_flop_count(query, key, value)


def _cpu_flash_backward_flops(
    grad_out: Size, query: Size, key: Size, value: Size, *_: object, **__: object
) -> int:
    return sdpa_backward_flop_count(grad_out, query, key, value)


def _extra_flop_formulas() -> dict[object, Callable[..., int]]:
    """FLOP formulas (shapes in, FLOPs out) for the CPU flash-attention kernels, which
    ``FlopCounterMode`` does not count (the CUDA ones it does)."""
    formulas: dict[str, Callable[..., int]] = {
        "_scaled_dot_product_flash_attention_for_cpu": _cpu_flash_flops,
        "_scaled_dot_product_flash_attention_for_cpu_backward": _cpu_flash_backward_flops,
    }
    aten = torch.ops.aten
    return {getattr(aten, name): count for name, count in formulas.items() if hasattr(aten, name)}


def count_flops(fn: Callable[[], object]) -> int:
    """FLOPs (2 per multiply-add) of the matmuls, convolutions and attention ``fn`` runs."""
    with FlopCounterMode(display=False, custom_mapping=_extra_flop_formulas()) as counter:
        fn()
    return int(counter.get_total_flops())


def saved_bytes(step: Step) -> int:
    """Bytes of the distinct storages autograd saves for the backward pass of ``step``."""
    step.reset()
    counter = SavedTensorBytes()
    with counter.track():
        loss = step.loss()
    del loss
    return counter.total


def peak_bytes(fn: Callable[[], object], device: torch.device) -> int | None:
    """The allocator's peak while ``fn`` runs, above its level at the start; None on a
    device type without a memory API."""
    gc.collect()
    if device.type == "cpu":
        return _cpu_peak_bytes(fn)
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is None or not hasattr(accelerator, "max_memory_allocated"):
        return None
    synchronize(device)
    index = device.index if device.index is not None else accelerator.current_device_index()
    accelerator.reset_peak_memory_stats(index)
    before = accelerator.memory_allocated(index)
    fn()
    synchronize(device)
    return int(accelerator.max_memory_allocated(index) - before)


def _cpu_peak_bytes(fn: Callable[[], object]) -> int:
    """Replay the profiler's CPU allocation (+) and free (-) events in time order."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = [
        (event.start_ns(), event.nbytes())
        for event in prof.profiler.kineto_results.events()
        if event.name() == "[memory]" and event.device_type() == torch.autograd.DeviceType.CPU
    ]
    level = peak = 0
    for _, nbytes in sorted(events):
        level += nbytes
        peak = max(peak, level)
    return peak


def square_matmul(device: torch.device, size: int) -> tuple[Callable[[], Tensor], int]:
    """A ``size x size`` float32 matmul on ``device`` to time beside the cases (the reference
    for achieved rates, measured under the same machine noise) and its FLOPs."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(size, size, generator=gen, dtype=torch.float32).to(device)
    b = torch.randn(size, size, generator=gen, dtype=torch.float32).to(device)
    return (lambda: a @ b), 2 * size**3


def configure_threads(threads: int | None) -> int:
    """Set torch's intra-op threads when given; return the count in use."""
    if threads is not None:
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}; pass a positive count")
        torch.set_num_threads(threads)
    return torch.get_num_threads()
