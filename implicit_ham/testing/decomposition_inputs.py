"""The layer, input and runs ``check_decomposition`` uses: a small feature map sized for the
layer, explicit initial bases from the layer's own distribution, a run under a given mode."""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from torch import Tensor

from implicit_ham.adjoints.modes import Adjoint, Unroll
from implicit_ham.decompositions import Decomposition
from implicit_ham.testing.report import NotApplicableError

BATCH = 2


def build(target: type[Decomposition] | Decomposition) -> Decomposition:
    """The layer under test, in training mode, its parameters and buffers in float64."""
    layer = (
        target(rank=2, steps=3, eval_steps=3) if isinstance(target, type) else copy.deepcopy(target)
    )
    return layer.train()


def feature_map(
    layer: Decomposition, dtype: torch.dtype, batch: int = BATCH, seed: int = 0
) -> Tensor:
    """x (batch, C, H, W) sized for the layer (d, n > rank), see ``check_decomposition``."""
    per_group = max(8, layer.rank + 2)
    channels = layer.channels or layer.groups * per_group
    side = max(4, math.ceil(math.sqrt(layer.rank + 2)))
    gen = torch.Generator().manual_seed(seed)
    shape = (batch, channels, side, side)
    if layer.nonnegative:
        x = 0.1 + torch.rand(shape, generator=gen, dtype=torch.float64)
    else:
        x = torch.randn(shape, generator=gen, dtype=torch.float64)
    return x.to(dtype).requires_grad_()


def initial_bases(layer: Decomposition, x: Tensor, seed: int = 1) -> Tensor:
    """Explicit D0 (B*S, d, r) drawn by the layer's own ``sample_bases`` from a fixed seed."""
    flat = layer.flatten(x.detach())
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        bases = layer.sample_bases((flat.shape[0], flat.shape[1], layer.rank), like=flat)
    return F.normalize(bases, dim=1, eps=layer.norm_eps)


def run_layer(
    layer: Decomposition, x: Tensor, adjoint: Adjoint | None, bases: Tensor | None
) -> Tensor:
    """``layer(x, init=bases)`` under ``adjoint`` (None: the layer's own). A ValueError from a
    solver refusing Unroll (as torchdeq's solvers do) skips the calling check."""
    saved = layer.adjoint
    try:
        if adjoint is not None:
            layer.adjoint = adjoint
        return layer(x, init=bases)
    except ValueError as err:
        if not isinstance(adjoint, Unroll):
            raise
        raise NotApplicableError(f"the layer's solver refuses {adjoint!r}: {err}") from err
    finally:
        layer.adjoint = saved


def x_gradient(loss: Tensor, x: Tensor) -> Tensor:
    """d loss / d x; zeros when the loss does not depend on x (no graph at all)."""
    if not loss.requires_grad:
        return torch.zeros_like(x)
    (grad,) = torch.autograd.grad(loss, x, allow_unused=True)
    return torch.zeros_like(x) if grad is None else grad
