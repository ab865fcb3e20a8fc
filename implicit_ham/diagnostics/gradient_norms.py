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
    through its tensor inputs.

    Tensor hooks, not ``register_full_backward_hook`` (which warns when no input of the layer
    requires gradient, e.g. a first layer fed with data): a forward pre-hook passes each
    positional input that requires gradient through an identity view and hooks the view (so it
    sees the gradient through this layer only, as a full backward hook does), and a forward
    hook hooks each output tensor (a Tensor, or the tensors of a tuple / list or of a
    ``Solution``'s value) that requires gradient. An input that needs no gradient has none to
    report; its key is then absent.

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
            self._handles.append(module.register_forward_pre_hook(self._inputs_hook(name)))
            self._handles.append(module.register_forward_hook(self._outputs_hook(name)))

    def detach(self) -> None:
        """Remove the hooks."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _recorder(self, key: str) -> Any:
        def record(grad: Tensor) -> None:
            self._squares.setdefault(key, []).append(torch.linalg.vector_norm(grad).square())

        return record

    def _inputs_hook(self, name: str) -> Any:
        record = self._recorder(f"{self.prefix}{name}/input")

        def hook(module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
            if not torch.is_grad_enabled() or not any(_needs_grad(a) for a in args):
                return None
            hooked = tuple(a.view_as(a) if _needs_grad(a) else a for a in args)
            for a in hooked:
                if _needs_grad(a):
                    a.register_hook(record)
            return hooked

        return hook

    def _outputs_hook(self, name: str) -> Any:
        record = self._recorder(f"{self.prefix}{name}/output")

        def hook(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
            for t in _output_tensors(output):
                if t.requires_grad:
                    t.register_hook(record)

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


def _needs_grad(value: Any) -> bool:
    return isinstance(value, Tensor) and value.requires_grad


def _output_tensors(output: Any) -> list[Tensor]:
    """The tensors of a layer's output: a Tensor, those of a tuple / list, or those of the
    ``value`` of a ``Solution``-like object."""
    if isinstance(output, Tensor):
        return [output]
    if isinstance(output, (tuple, list)):
        return [t for item in output for t in _output_tensors(item)]
    value = getattr(output, "value", None)
    return [] if value is None else _output_tensors(value)
