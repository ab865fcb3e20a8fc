"""Gradient norms: global, per submodule, per optimizer parameter group, and at the input and
output of every implicit layer (backward hooks).

All norms are Euclidean norms of ``.grad`` (or of the hooked gradients); each function gathers
its norms on the device and synchronises with the host once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from implicit_ham.adjoints.layers import ROOT


def _norms(tensors: list[Tensor]) -> list[float]:
    """Euclidean norm of each tensor, with one host synchronisation."""
    if not tensors:
        return []
    device = tensors[0].device
    stacked = torch.stack([torch.linalg.vector_norm(t.detach()).to(device) for t in tensors])
    return stacked.tolist()


def _combine(squares: Iterable[float]) -> float:
    return float(sum(squares)) ** 0.5


def grad_norms(
    model: nn.Module,
    *,
    depth: int = 1,
    optimizer: torch.optim.Optimizer | None = None,
    prefix: str = "grad_norm/",
) -> dict[str, float]:
    """Norms of the parameters' ``.grad``.

    Args:
        model: the model, after ``backward()``.
        depth: parameters are grouped by the first ``depth`` parts of their module's dotted
            name (1: the direct children); the model's own parameters go under ``ROOT``.
        optimizer: when given, one norm per parameter group (``group["name"]`` or its index).
        prefix: prefix of every key.

    Returns:
        ``{prefix + "global": ..., prefix + "module/<name>": ..., prefix + "group/<g>": ...}``;
        parameters without a gradient are left out (a module with none is absent).
    """
    named = [(n, p) for n, p in model.named_parameters() if p.grad is not None]
    values = _norms([p.grad for _, p in named])  # type: ignore[misc]
    squares = {id(p): v * v for (_, p), v in zip(named, values, strict=True)}
    out = {prefix + "global": _combine(squares.values())}
    modules: dict[str, list[float]] = {}
    for name, p in named:
        parts = name.split(".")[:-1]
        key = ".".join(parts[:depth]) if parts else ROOT
        modules.setdefault(key, []).append(squares[id(p)])
    out.update({f"{prefix}module/{k}": _combine(v) for k, v in modules.items()})
    if optimizer is not None:
        for i, group in enumerate(optimizer.param_groups):
            label = group.get("name", str(i))
            members = [squares[id(p)] for p in group["params"] if id(p) in squares]
            out[f"{prefix}group/{label}"] = _combine(members)
    return out


class LayerGradientHooks:
    """Records the norm of the gradient arriving at each implicit layer's output and leaving
    through its tensor inputs (``register_full_backward_hook``).

    Attach before the forward pass of a step to measure, read with ``pop()`` after backward,
    then detach (hooks cost a little on every forward while attached). A layer called several
    times in one step reports the root of the summed squares over its calls.

    Args:
        layers: name -> module (e.g. ``find_implicit_layers(model)``).
        prefix: key prefix; keys are ``<prefix><name>/output`` and ``<prefix><name>/input``.
    """

    def __init__(self, layers: Mapping[str, nn.Module], prefix: str = "grad_norm/layer/") -> None:
        self.layers = dict(layers)
        self.prefix = prefix
        self._handles: list[RemovableHandle] = []
        self._squares: dict[str, list[Tensor]] = {}

    @property
    def attached(self) -> bool:
        """Whether the hooks are registered."""
        return bool(self._handles)

    def attach(self) -> None:
        """Register the hooks (no-op when already attached)."""
        if self.attached:
            return
        for name, module in self.layers.items():
            self._handles.append(module.register_full_backward_hook(self._hook_for(name)))

    def detach(self) -> None:
        """Remove the hooks."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _hook_for(self, name: str) -> Any:
        def hook(
            module: nn.Module,
            grad_input: tuple[Tensor | None, ...],
            grad_output: tuple[Tensor | None, ...],
        ) -> None:
            for side, grads in (("output", grad_output), ("input", grad_input)):
                present = [g.detach() for g in grads if g is not None]
                if present:
                    sq = sum(torch.linalg.vector_norm(g).square() for g in present)
                    self._squares.setdefault(f"{self.prefix}{name}/{side}", []).append(sq)

        return hook

    def pop(self) -> dict[str, float]:
        """The recorded norms since the last ``pop`` (one host synchronisation), then clear."""
        keys = list(self._squares)
        totals = [torch.stack(self._squares[k]).sum() for k in keys]
        self._squares.clear()
        if not totals:
            return {}
        device = totals[0].device
        values = torch.stack([t.to(device) for t in totals]).sqrt().tolist()
        return dict(zip(keys, values, strict=True))
