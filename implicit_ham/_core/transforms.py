"""Which torch.func transforms are active, and whether torch.compile is tracing: host-side
checks adapt to them.

Under ``vmap``, and while ``torch.compile`` traces, a tensor's values cannot steer Python control
flow (vmap cannot, and the compiler would break the graph there), so the checks that read a value
on the host (finiteness, convergence warnings) are skipped; under ``grad`` / ``vjp`` /
``jacrev`` alone, and in eager mode, they run. The at-fixed-point modes (Implicit, Neumann)
attach their gradient differently under a transform (``func_gradient``)."""

from __future__ import annotations

import torch
from torch._C import _functorch


def active_transforms() -> list[str]:
    """Names of the torch.func transforms wrapping the current call, outermost first
    (e.g. ``["Vmap", "Grad"]``); empty outside any transform."""
    if torch.compiler.is_compiling():
        return []
    stack = _functorch.get_interpreter_stack() or []
    return [interpreter.key().name for interpreter in stack]


def under_vmap() -> bool:
    """Whether a ``torch.func.vmap`` (or ``jacrev`` / ``jacfwd``'s inner vmap) is active."""
    return "Vmap" in active_transforms()


def host_checks() -> bool:
    """Whether checks that read tensor values on the host may run: not under ``vmap`` and not
    while ``torch.compile`` traces (there they would break the graph)."""
    return not torch.compiler.is_compiling() and not under_vmap()


def exporting() -> bool:
    """Whether the current call is being exported (``torch.export``, and ``torch.onnx.export``
    with ``dynamo=True`` or the TorchScript exporter): the graph keeps operations, not values,
    so a layer whose forward is not a fixed function of its inputs and buffers must refuse."""
    return torch.compiler.is_exporting() or torch.onnx.is_in_onnx_export()
