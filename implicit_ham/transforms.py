"""Which torch.func transforms are active: host-side checks adapt to them.

Under ``vmap`` a tensor's values cannot steer Python control flow, so the checks that read a
value on the host (finiteness, convergence warnings) are skipped there; under ``grad`` /
``vjp`` / ``jacrev`` alone they still run. The modes that run their own autograd graph in
backward (Implicit, Neumann) refuse every transform with a clear error.
"""

from __future__ import annotations

from torch._C import _functorch


def active_transforms() -> list[str]:
    """Names of the torch.func transforms wrapping the current call, outermost first
    (e.g. ``["Vmap", "Grad"]``); empty outside any transform."""
    stack = _functorch.get_interpreter_stack() or []
    return [interpreter.key().name for interpreter in stack]


def under_vmap() -> bool:
    """Whether a ``torch.func.vmap`` (or ``jacrev`` / ``jacfwd``'s inner vmap) is active."""
    return "Vmap" in active_transforms()
