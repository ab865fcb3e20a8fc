"""Checks of a problem's inputs made once per solve, before the first call of ``f``: what would
otherwise surface as a bare PyTorch error from inside ``f`` (a matmul between float64 and
float32, tensors on two devices).

``f``'s parameters are those of the modules it is or closes over: ``f`` itself when it is an
``nn.Module``, the module of a bound method (``layer.step``), and the modules in the closure
cells of a function (``lambda z, x: torch.tanh(lin(z) + x)``). A module's dtype and device are
read from its first floating-point parameter (O(1) per module). Under autocast the dtype check
is left out (autocast casts the operands itself); while ``torch.compile`` traces, nothing is
checked (the metadata reads would become guards).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor, nn


def modules_of(f: Callable[..., Any]) -> Iterator[nn.Module]:
    """The ``nn.Module``s whose parameters ``f`` computes with: ``f`` itself, the instance of a
    bound method, the modules in a function's closure cells."""
    if isinstance(f, nn.Module):
        yield f
        return
    owner = getattr(f, "__self__", None)
    if isinstance(owner, nn.Module):
        yield owner
        return
    for cell in getattr(f, "__closure__", None) or ():
        try:
            content = cell.cell_contents
        except ValueError:  # an empty cell (a variable not yet assigned)
            continue
        if isinstance(content, nn.Module):
            yield content


def first_floating_parameter(module: nn.Module) -> tuple[str, Tensor] | None:
    """``(name, parameter)`` of the module's first parameter in ``named_parameters`` order
    when it is floating-point (the module's dtype and device), else None. A depth-first walk
    that stops at the first parameter (``named_parameters`` would set up a whole traversal)."""
    for name, parameter in module._parameters.items():
        if parameter is not None:
            return (name, parameter) if parameter.is_floating_point() else None
    for child_name, child in module._modules.items():
        found = None if child is None else first_floating_parameter(child)
        if found is not None:
            return f"{child_name}.{found[0]}", found[1]
    return None


def check_state_against_parameters(
    f: Callable[..., Any], z0: tuple[Tensor, ...], where: str
) -> None:
    """Raise before the first call of ``f`` when z0 (a tuple of (B, ...) tensors sharing a
    dtype) cannot meet the parameters ``f`` computes with: TypeError for a floating dtype
    other than theirs (outside autocast), ValueError for another device. The message names
    the parameter and the fix."""
    if torch.compiler.is_compiling() or not z0 or not z0[0].is_floating_point():
        return
    state = z0[0]
    for module in modules_of(f):
        found = first_floating_parameter(module)
        if found is None:
            continue
        name, parameter = found
        label = f"{type(module).__name__}.{name}"
        if parameter.device != state.device and parameter.device.type != "meta":
            raise ValueError(
                f"{where}: z0 is on {state.device} but f's parameter {label} is on "
                f"{parameter.device}; create z0 on the parameters' device (e.g. "
                f"torch.zeros(..., device={str(parameter.device)!r})) or move the module."
            )
        if parameter.dtype != state.dtype and not torch.is_autocast_enabled(state.device.type):
            raise TypeError(
                f"{where}: z0 is {state.dtype} but f's parameter {label} is {parameter.dtype}; "
                f"f would fail on (or change the dtype of) the state. Create z0 in the "
                f"parameters' dtype (e.g. torch.zeros(..., dtype={parameter.dtype})) or "
                f"convert the module (module.to({state.dtype}))."
            )
