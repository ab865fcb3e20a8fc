"""An ``nn.Module``'s parameters as the variable of ``minimize`` / ``root``.

``module_state(model, batch=B)`` returns ``{name: (B, *shape)}``: detached copies of the
parameters with a leading batch dimension (B independent problems, e.g. B tasks of iMAML), a
pytree ``minimize`` accepts as ``z0``. ``call_module(model, params, *inputs)`` runs the model
with those weights instead of its own (``torch.func.functional_call``), vmapped over the batch
dimension of ``params`` and of the inputs, so task b's weights see task b's data::

    theta0 = ih.module_state(model, batch=B)          # {name: (B, *shape)}
    def inner(theta, phi, x, y):                      # x (B, n, 1), y (B, n, 1)
        fit = ((ih.call_module(model, theta, x) - y) ** 2).mean(dim=(1, 2))
        prox = sum(((theta[k] - phi[k]) ** 2).flatten(1).sum(1) for k in theta)
        return fit + lam / 2 * prox                   # (B,): one loss per task
    theta_star = ih.minimize(inner, theta0, phi, x, y).value
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn


def module_state(module: nn.Module, batch: int = 1) -> dict[str, Tensor]:
    """``{name: (batch, *shape)}``: the module's parameters, detached and repeated ``batch``
    times along a new leading dimension (the initial point of B independent problems).

    Raises:
        TypeError: ``module`` is not an ``nn.Module``. ValueError: it has no parameters, or
            ``batch`` is not a positive int.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"module_state: expected an nn.Module, got {type(module).__name__}")
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"module_state: batch must be a positive int, got {batch!r}")
    params = dict(module.named_parameters())
    if not params:
        raise ValueError(f"module_state: {type(module).__name__} has no parameters")
    return {
        name: p.detach().unsqueeze(0).expand(batch, *p.shape).clone()
        for name, p in params.items()
    }


def call_module(module: nn.Module, params: dict[str, Tensor], *inputs: Any) -> Any:
    """``module(*inputs)`` with the weights ``params`` ({name: (B, *shape)}), sample b's
    weights on sample b of every input (inputs batch first, (B, ...)); parameters missing from
    ``params`` and buffers are the module's own.

    Raises:
        ValueError: a name that is not one of the module's parameters, or a leaf whose shape
            is not (B, *parameter shape).
    """
    own = dict(module.named_parameters())
    unknown = sorted(set(params) - set(own))
    if unknown:
        raise ValueError(
            f"call_module: {unknown} are not parameters of {type(module).__name__} "
            f"(its parameters: {sorted(own)})"
        )
    for name, value in params.items():
        if tuple(value.shape[1:]) != tuple(own[name].shape):
            raise ValueError(
                f"call_module: params[{name!r}] has shape {tuple(value.shape)}; expected "
                f"(B, {', '.join(map(str, own[name].shape))}) (see ih.module_state)"
            )

    def one(weights: dict[str, Tensor], *args: Any) -> Any:
        return torch.func.functional_call(module, weights, args)

    return torch.func.vmap(one)(params, *inputs)
