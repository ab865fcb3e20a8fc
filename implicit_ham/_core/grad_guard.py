"""A finiteness check on the gradient that reaches a tensor: never a silent NaN gradient.

``guard_gradient(x, where)`` is the identity in forward; in backward it raises
``NonFiniteError`` naming ``where`` if the incoming gradient holds a NaN or an infinity. The
fixed-point entry point puts it on every input that requires grad, so an overflowing backward
pass (e.g. unrolling through huge float32 inputs) is an error at the layer, not a NaN that flows
on into the optimiser. Cost: one reduction and one host synchronisation per guarded tensor per
backward. Forward mode (``torch.func.jvp`` / ``jacfwd`` / ``hessian``, which is jacfwd of
jacrev) passes tangents through unchanged, and ``generate_vmap_rule`` lets vmap batch it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from implicit_ham._core.errors import NonFiniteError
from implicit_ham._core.transforms import host_checks


class _FiniteGradient(torch.autograd.Function):
    generate_vmap_rule = True

    @staticmethod
    def forward(x: Tensor, where: str) -> Tensor:
        return x.view_as(x)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Tensor, str], output: Tensor) -> None:
        ctx.where = inputs[1]

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        if host_checks() and not bool(torch.isfinite(grad).all()):
            raise NonFiniteError(
                f"{ctx.where}: the gradient is non-finite (NaN or inf; shape "
                f"{tuple(grad.shape)}). The backward pass overflowed or divided by zero (e.g. "
                "huge float32 inputs, a rank-deficient input to an orthogonalisation). Use "
                "float64, rescale the input, or another backward mode (e.g. OneStep)."
            )
        return grad, None

    @staticmethod
    def jvp(ctx: Any, tangent: Tensor, _where: None) -> Tensor:
        """Forward mode: the identity on the tangent (no check: a tangent pushed forward is
        checked by the outputs it reaches, not here)."""
        return tangent


def guard_gradient(x: Tensor, where: str) -> Tensor:
    """``x`` itself, whose backward raises ``NonFiniteError`` on a non-finite gradient. While
    ``torch.compile`` traces, ``x`` unguarded: the check is a host check (skipped there anyway) and
    Dynamo cannot trace an ``autograd.Function`` with a ``jvp`` rule (it would break the graph)."""
    if torch.compiler.is_compiling():
        return x
    if not (isinstance(x, Tensor) and x.requires_grad and torch.is_grad_enabled()):
        return x
    return _FiniteGradient.apply(x, where)
