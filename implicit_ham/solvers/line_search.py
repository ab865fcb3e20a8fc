"""Batched, rounding-robust backtracking line search for the minimizers (L-BFGS, Newton-CG).

The state is viewed as ``rows`` independent problems, one row of the (rows, n) matrix each:
``rows = B`` for a batch of independent problems (the default of ``minimize``), ``rows = 1`` for
a coupled batch (``batch_coupled=True``: the whole state is one problem). Every row gets its own
step size, so one badly scaled sample does not shrink the steps of the others.

Acceptance (per row, step t along d from x with value f0 and slope ``s0 = grad·d < 0``):

* Armijo: ``f(x + t d) <= f0 + c1 t s0``; or, when that cannot be resolved in the dtype,
* the approximate Wolfe test of Hager & Zhang (2005): ``f(x + t d) <= f0 + ε |f0|`` (ε a few
  units of the dtype's rounding) and ``grad(x + t d)·d <= (2 c1 - 1) s0``: the directional
  derivative, which stays accurate where the values no longer differ, shows the step did not
  overshoot the minimum along d.

A row whose halvings all fail (or whose d is not a descent direction) is *stalled*: its x is
kept and the caller stops it with that status instead of spending its remaining steps.

Each trial evaluates the value and the gradient in one pass (``Probe``): the gradient at the
accepted point is the next iteration's, so an accepted first trial costs one forward and one
backward pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from implicit_ham._core.transforms import active_transforms
from implicit_ham.solvers.minimizers import Objective

ARMIJO_C1 = 1e-4
ROUNDING_UNITS = 10.0  # ε of the approximate test, in units of the dtype's eps
MAX_HALVINGS = 30


@dataclass(frozen=True)
class Probe:
    """Values and gradients of ``objective`` on its state viewed as ``rows`` problems.

    Attributes:
        objective: the problem. rows: B (independent problems) or 1 (one coupled problem).
        shared: the loss is one scalar over independent rows (not per-sample values), so the
            rows' values cannot be told apart: the line search takes one step for all rows.
    """

    objective: Objective
    rows: int
    shared: bool

    @classmethod
    def of(cls, objective: Objective, x0: Tensor) -> Probe:
        """The view of ``objective`` its ``batch_coupled`` flag asks for; x0 is (B, n) flat."""
        batch = objective.spec.batch
        if objective.batch_coupled or batch == 1:
            return cls(objective, 1, False)
        with torch.no_grad():
            out = objective.loss(objective.state(x0))
        return cls(objective, batch, out.numel() != batch)

    def view(self, x: Tensor) -> Tensor:
        """(rows, n): the flat state x of any shape as rows."""
        return x.reshape(self.rows, -1)

    def evaluate(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """(f (rows,), grad (rows, n)) at x (rows, n), one forward and one backward pass,
        without graph."""
        if active_transforms():  # under torch.func: its grad (autograd.grad cannot run there)
            grad, (total, out) = torch.func.grad_and_value(self._total, has_aux=True)(x)
            return self._values(total.detach(), out.detach()), grad
        with torch.enable_grad():
            xr = x.detach().requires_grad_()
            out = self.objective.loss(self.objective.state(xr))
            total = out if out.ndim == 0 else out.sum()
            (grad,) = torch.autograd.grad(total, xr)
        return self._values(total.detach(), out.detach()), grad

    def _total(self, x: Tensor) -> tuple[Tensor, Tensor]:
        out = self.objective.loss(self.objective.state(x))
        return out.sum(), out

    def _values(self, total: Tensor, out: Tensor) -> Tensor:
        if self.rows == 1:
            values = total.reshape(1)
        elif out.numel() == self.rows:
            values = out.reshape(self.rows)
        else:
            values = total.expand(self.rows)
        return values

    def combine(self, per_row: Tensor) -> Tensor:
        """(rows,): a per-row quantity as the line search must compare it (summed over rows
        when they share a step)."""
        return per_row.sum().expand(self.rows) if self.shared else per_row


@dataclass(frozen=True)
class Step:
    """A line search's outcome per row: the new point, its value and gradient, and which rows
    found an acceptable step (the others are stalled and kept at x); ``full_step`` says on
    the host that every row took its full first step (the common case)."""

    x: Tensor
    value: Tensor
    grad: Tensor
    accepted: Tensor
    full_step: bool = False


def backtrack(
    probe: Probe,
    x: Tensor,
    value: Tensor,
    grad: Tensor,
    direction: Tensor,
    active: Tensor,
    slope0: Tensor | None = None,
    downhill: bool = False,
) -> Step:
    """Halve ``t = 1, 1/2, ...`` per active row until the Armijo or the approximate Wolfe test
    holds (see the module docstring); without gradient.

    The first trial (t = 1 for every row) is taken for all rows at once and accepted without
    further work when it passes the Armijo test everywhere (the test that needs the fewest
    operations); otherwise its values serve as the first halving step's.

    Args:
        probe: the problem's rows. x, grad, direction: (rows, n). value: (rows,) f at x.
        active: (rows,) bool, the rows still being solved (the others do not move: their
            direction must be zero).
        slope0: (rows,) ``grad·direction`` per row when the caller has it (else computed).
        downhill: the caller has checked that every row is active with ``slope0 < 0``.
    """
    with torch.no_grad():
        if slope0 is None:
            slope0 = torch.linalg.vecdot(grad, direction)
        slope0 = probe.combine(slope0)
        if downhill and not probe.shared:
            pending, every_row = active, True
        else:
            pending = active & (slope0 < 0)
            every_row = bool(pending.all())
        trial = x + direction if every_row else torch.where(pending[:, None], x + direction, x)
        f, g = probe.evaluate(trial)
        armijo = (f <= torch.add(value, slope0, alpha=ARMIJO_C1)) & torch.isfinite(f)
        if every_row and bool(armijo.all()):  # the common case: every row's full step passes
            return Step(trial, f, g, pending, full_step=True)
        floor = ROUNDING_UNITS * torch.finfo(x.dtype).eps * value.abs()
        t = torch.ones_like(value)
        new_x, new_value, new_grad = x, value, grad
        accepted = torch.zeros_like(active)
        for halving in range(MAX_HALVINGS):
            ok = pending & _acceptable(probe, f, g, value, slope0, floor, direction, t)
            new_x = torch.where(ok[:, None], trial, new_x)
            new_value = torch.where(ok, f, new_value)
            new_grad = torch.where(ok[:, None], g, new_grad)
            accepted, pending = accepted | ok, pending & ~ok
            if halving == MAX_HALVINGS - 1 or not bool(pending.any()):
                break
            t = torch.where(pending, t / 2, t)
            trial = torch.where(pending[:, None], x + t[:, None] * direction, new_x)
            f, g = probe.evaluate(trial)
        return Step(new_x, new_value, new_grad, accepted)


def _acceptable(
    probe: Probe,
    f: Tensor,
    g: Tensor,
    value: Tensor,
    slope0: Tensor,
    floor: Tensor,
    direction: Tensor,
    t: Tensor | float,
) -> Tensor:
    """(rows,) bool: the Armijo or the approximate Wolfe test at the trial (f, g)."""
    armijo = f <= value + ARMIJO_C1 * t * slope0
    slope = probe.combine((g * direction).sum(1))
    approximate = (f <= value + floor) & (slope <= (2 * ARMIJO_C1 - 1) * slope0)
    return (armijo | approximate) & torch.isfinite(f)
