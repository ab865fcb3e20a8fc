"""Refuse a loss that couples the samples of a batch solved as independent problems.

``minimize`` treats the B samples of its state as B independent problems by default
(``batch_coupled=False``): each gets its own line search, curvature memory and stopping test,
and the implicit backward solves each sample's Hessian block (``PerSampleCG``). A loss in which
one sample's gradient depends on another sample's variables breaks all of that silently: the
forward stalls or stops early, and the gradient solves the wrong (block-diagonal) system. The
common way to get there is a single problem passed without its batch dimension (a (n,) vector
read as n samples of one scalar each).
"""

from __future__ import annotations

import logging

import torch
from torch import Tensor

from implicit_ham._core.state import State
from implicit_ham._core.transforms import active_transforms, host_checks
from implicit_ham.solvers.minimizers import Objective

logger = logging.getLogger(__name__)


def check_independent_loss(objective: Objective, z0: State, where: str) -> None:
    """ValueError when the loss couples sample 0 with the other samples of z0's batch.

    Two Hessian-vector products at z0 (one loss evaluation, one backward pass with graph and
    two double-backward passes): with sample 0's rows set (``v``) the other samples' rows of
    ``H v`` must be exactly zero, and with the other samples' rows set sample 0's rows must
    be. Exact zeros, so no tolerance: a sum of per-sample losses has an exactly block-diagonal
    Hessian (its off-diagonal entries are sums of products with exact zeros; NaN / inf entries
    are left to the solve's finiteness checks). Not caught: a coupling with zero curvature at
    z0 (a loss linear there) and one between two samples other than 0. Skipped for a batch of
    one, under torch.func transforms and while ``torch.compile`` traces (the decision reads
    values on the host), and when the loss has no second derivative (the solve reports that
    itself where it needs one).

    Args:
        objective: the problem (``Objective.batch_coupled`` False).
        z0: the initial state (tuple of (B, ...) tensors).
        where: the caller's name for the message.
    """
    batch = objective.spec.batch
    if batch < 2 or active_transforms() or not host_checks():
        return
    x = objective.flat(tuple(t.detach() for t in z0)).reshape(batch, -1)
    with torch.enable_grad():
        xr = x.clone().requires_grad_()
        value = objective.value(xr.reshape(-1))
        (grad,) = torch.autograd.grad(value, xr, create_graph=True)
        if not grad.requires_grad:  # linear in z, or a backward that is not differentiable
            return
        first = torch.zeros_like(xr)
        first[0] = 1.0
        products: list[Tensor | None] = []
        try:
            for probe in (first, 1.0 - first):
                (hv,) = torch.autograd.grad(grad, xr, probe, retain_graph=True, allow_unused=True)
                products.append(hv)
        except (RuntimeError, NotImplementedError) as error:  # an op without double backward
            logger.debug("%s: coupling probe skipped (%s)", where, error)
            return
    into_others, into_first = products
    leaks = _leaks(into_others, slice(1, None)) or _leaks(into_first, slice(0, 1))
    if not leaks:
        return
    vector = len(z0) == 1 and z0[0].ndim == 1
    hint = (
        f"z0 is a vector of shape ({batch},), read as {batch} samples of one value each: for "
        f"one problem over that vector give it a batch dimension (z0[None], shape (1, {batch}); "
        "the loss then sees z of shape (1, n)). "
        if vector
        else ""
    )
    raise ValueError(
        f"{where}: the loss couples the samples of z0's batch (B = {batch}: sample 0's "
        "gradient depends on the other samples' variables, or the reverse), but they are "
        f"solved as independent problems (batch_coupled=False). {hint}For one problem over the "
        "whole batch pass batch_coupled=True; otherwise make each sample's loss depend on its "
        "own variables only (no batch statistics)."
    )


def _leaks(product: Tensor | None, rows: slice) -> bool:
    """Whether ``product`` (B, n) has a finite non-zero entry in ``rows`` (a NaN / inf there
    comes from a non-finite loss at z0, which the solve reports itself, not from coupling)."""
    if product is None:
        return False
    part = product[rows]
    return bool(((part != 0) & part.isfinite()).any())
