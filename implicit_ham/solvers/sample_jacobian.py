"""Per-sample Jacobians of a batch of independent residual functions, in O(P) work.

For P independent problems ``r_p = fn(x)_p`` depending on ``x_p`` only (x of shape (P, n), r of
shape (P, R)), the Jacobian of the whole batch is block diagonal, so its P blocks come out of
``min(n, R)`` products instead of ``P · min(n, R)``: forward mode pushes each basis direction
``e_j`` into every sample at once (the product ``J (e_j in every sample)``), reverse mode
pulls each residual index back from every sample at once (``Jᵀ (e_i in every sample)``).
Forward mode is chosen when ``n <= R`` (fewer directions than residuals), reverse otherwise,
both by autograd (forward products as the derivative of a reverse one), and they compose
with it: under grad mode the Jacobian carries the gradient of x and of the tensors fn closes
over (the
unrolled Gauss-Newton steps need it).

The trick is wrong for a residual that couples samples (batch statistics, a shared solve):
``check_independent`` probes that once, with sample 0, by two reverse products.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

ResidualFn = Callable[[Tensor], Tensor]


def residuals_and_jacobian(fn: ResidualFn, x: Tensor, rows: int) -> tuple[Tensor, Tensor]:
    """(r (P, R), J (P, R, n)) of the independent problems ``fn`` at x (P, n); both carry a
    graph (to x and what fn closes over) when grad mode is on.

    Args:
        fn: (P, n) -> (P, R), sample p depending on x[p] only.
        x: the point. rows: R (to choose the mode).
    """
    keep = torch.is_grad_enabled()
    n = x.shape[1]
    with torch.enable_grad():
        xr = x if x.requires_grad else x.detach().requires_grad_()
        out = fn(xr)
        if n <= rows:
            columns = _forward_columns(out, xr, n, keep)
        else:
            columns = _reverse_rows(out, xr, rows, keep)
    r = out if keep else out.detach()
    return r, columns if keep else columns.detach()


def _forward_columns(out: Tensor, x: Tensor, n: int, keep: bool) -> Tensor:
    """(P, R, n): ``J e_j`` for each direction e_j placed in every sample, as the derivative
    of the reverse product ``u -> Jᵀ u`` (double backward: forward-mode AD of broadcasting
    ops is much slower in this torch)."""
    u = torch.zeros_like(out, requires_grad=True)
    (transposed,) = torch.autograd.grad(out, x, u, create_graph=True, allow_unused=True)
    if transposed is None or not transposed.requires_grad:  # fn does not depend on x
        return out.new_zeros(*out.shape, n)
    basis = torch.eye(n, dtype=x.dtype, device=x.device)
    columns = []
    for j in range(n):
        (column,) = torch.autograd.grad(
            transposed, u, basis[j].expand_as(x), retain_graph=True, create_graph=keep,
            allow_unused=True,
        )
        columns.append(torch.zeros_like(out) if column is None else column)
    return torch.stack(columns, dim=-1)


def _reverse_rows(out: Tensor, x: Tensor, rows: int, keep: bool) -> Tensor:
    """(P, R, n): row i of every sample's Jacobian at once, pulled back from residual i of
    every sample (R reverse products, batched)."""
    basis = torch.eye(rows, dtype=out.dtype, device=out.device)[:, None, :].expand(
        rows, *out.shape
    )
    (grads,) = torch.autograd.grad(
        out, x, basis, retain_graph=keep, create_graph=keep, allow_unused=True,
        is_grads_batched=True,
    )
    if grads is None:
        return out.new_zeros(*out.shape, x.shape[1])
    return grads.permute(1, 0, 2)


def check_independent(fn: ResidualFn, x: Tensor, where: str) -> None:
    """ValueError when ``fn`` couples sample 0 with the others, so that the block-diagonal
    Jacobian of ``residuals_and_jacobian`` is not its Jacobian.

    Two reverse products: sample 0's residuals pulled back (the other samples' gradient must
    be exactly zero) and the other samples' residuals pulled back (sample 0's must be). Exact
    zeros, so no tolerance: any dependence through a batch statistic (a mean, a norm over the
    batch) is caught; a dependence between two samples other than 0 is not. Costs one
    evaluation and one batched backward pass.
    """
    if x.shape[0] < 2:
        return
    with torch.enable_grad():
        xr = x.detach().requires_grad_()
        out = fn(xr)
        first = torch.zeros_like(out)
        first[0] = 1.0
        probes = torch.stack([first, 1.0 - first])
        (grads,) = torch.autograd.grad(out, xr, probes, allow_unused=True, is_grads_batched=True)
    if grads is None:
        return
    leaks = (grads[0, 1:] != 0).any() | (grads[1, 0] != 0).any()
    if bool(leaks):
        raise ValueError(
            f"{where}: the residuals couple samples (sample 0's residuals and the others' "
            "variables, or the reverse, depend on each other), but the batch is treated as "
            "independent problems. Pass batch_coupled=True to solve the whole batch as one "
            "problem, or make each sample's residuals depend on its own variables only (no "
            "batch statistics)."
        )
