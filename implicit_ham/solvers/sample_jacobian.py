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
``check_independent`` probes that once with one reverse product.
"""

from __future__ import annotations

import math
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


def check_independent(fn: ResidualFn, x: Tensor, jac: Tensor, where: str) -> None:
    """ValueError when ``fn`` couples samples, so that ``jac`` (the block-diagonal Jacobian
    of ``residuals_and_jacobian``) is not its Jacobian.

    One reverse product with a fixed, generic probe u (P, R) compares ``(dfn/dx)ᵀ u`` with
    the blocks' ``J_pᵀ u_p``; a dependence of any sample on another changes it (unless it is
    below √eps of the Jacobian's size). Costs one evaluation and one backward pass.
    """
    count, rows = jac.shape[0], jac.shape[1]
    if count < 2:
        return
    index = torch.arange(count * rows, dtype=x.dtype, device=x.device).reshape(count, rows)
    probe = torch.sin(1.0 + 0.7548776662 * index)  # generic, and no global RNG state used
    with torch.enable_grad():
        xr = x.detach().requires_grad_()
        (full,) = torch.autograd.grad(fn(xr), xr, probe, allow_unused=True)
    full = torch.zeros_like(x) if full is None else full
    blocks = torch.einsum("pri,pr->pi", jac.detach(), probe)
    gap = float(torch.linalg.vector_norm(full - blocks))
    size = float(torch.linalg.vector_norm(jac.detach())) * math.sqrt(rows)
    if not gap <= math.sqrt(torch.finfo(x.dtype).eps) * max(size, torch.finfo(x.dtype).tiny):
        raise ValueError(
            f"{where}: the residuals couple samples (sample p's residuals depend on other "
            f"samples' variables: ||(dr/dz)ᵀu - blocks|| = {gap:.3e} on a probe), but the "
            "batch is treated as independent problems. Pass batch_coupled=True to solve the "
            "whole batch as one problem, or make each sample's residuals depend on its own "
            "variables only (no batch statistics)."
        )
