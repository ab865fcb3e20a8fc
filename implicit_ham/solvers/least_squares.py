"""Forward solvers of ``least_squares``: ``GaussNewton`` and ``LevenbergMarquardt`` for a sum
of squares ``½||r(z)||²``, with the dense Jacobian of r (``torch.func.jacrev``): small problems
(curve fits), not images. They refuse the through-iteration modes (ValueError): their steps
(inner solves, step halving) are not differentiable maps; use ``Implicit``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from implicit_ham._core.validation import check_budget, check_tolerance
from implicit_ham.solvers.minimizers import MINIMIZERS, FlatMinimizer, Iterates, Objective


@MINIMIZERS.register("gauss_newton")
@dataclass(frozen=True)
class GaussNewton(FlatMinimizer):
    """Gauss-Newton for ``½||r(z)||²``: ``Δ = argmin ||J Δ + r||`` (least squares on the
    dense Jacobian), halved until the loss decreases (30 tries).

    Args:
        max_steps: iterations. tol: stop when every sample's gradient ``J^T r`` has norm
            ``<= tol``.
    """

    max_steps: int = 50
    tol: float | None = 1e-10
    needs_residuals: ClassVar[bool] = True

    def __post_init__(self) -> None:
        check_budget("GaussNewton", self.max_steps, self.tol)

    def _iterates(self, objective: Objective, x: Tensor) -> Iterates:
        r, jac = objective.residual_jacobian(x)
        while True:
            yield x, jac.T @ r
            delta = torch.linalg.lstsq(jac, -r[:, None], driver="gelsd").solution[:, 0]
            x = _decrease(objective, x, 0.5 * float(r @ r), delta)
            r, jac = objective.residual_jacobian(x)


def _decrease(objective: Objective, x: Tensor, loss: float, delta: Tensor) -> Tensor:
    """``x + t Δ`` with the first ``t = 1, 1/2, ...`` (30 tries) that does not raise the loss."""
    with torch.no_grad():
        t = 1.0
        for _ in range(30):
            if float(objective.value(x + t * delta)) <= loss:
                return x + t * delta
            t /= 2
        return x


@MINIMIZERS.register("levenberg_marquardt")
@dataclass(frozen=True)
class LevenbergMarquardt(FlatMinimizer):
    """Levenberg-Marquardt for ``½||r(z)||²``: ``(J^T J + μ I) Δ = -J^T r`` on the dense
    Jacobian, μ adapted by the gain ratio (Nielsen's rule); a rejected step raises μ.

    Args:
        max_steps: iterations (accepted or rejected). tol: stop when every sample's gradient
            ``J^T r`` has norm ``<= tol``. mu0: the initial damping, relative to
            ``max diag(J^T J)``.
    """

    max_steps: int = 100
    tol: float | None = 1e-10
    mu0: float = 1e-3
    needs_residuals: ClassVar[bool] = True

    def __post_init__(self) -> None:
        check_budget("LevenbergMarquardt", self.max_steps, self.tol)
        check_tolerance("LevenbergMarquardt", "mu0", self.mu0)

    def _iterates(self, objective: Objective, x: Tensor) -> Iterates:
        r, jac = objective.residual_jacobian(x)
        gram, grad = jac.T @ jac, jac.T @ r
        mu, nu = self.mu0 * float(gram.diagonal().max()), 2.0
        while True:
            yield x, grad
            eye = torch.eye(len(x), dtype=x.dtype, device=x.device)
            delta = torch.linalg.solve(gram + mu * eye, -grad)
            with torch.no_grad():
                r_new = objective.residuals(objective.state(x + delta)).reshape(-1)  # type: ignore[misc]
            actual = 0.5 * float(r @ r - r_new @ r_new)
            predicted = 0.5 * float(delta @ (mu * delta - grad))
            if predicted > 0 and actual >= 0:  # 0: no change to round-off, near the minimum
                x = x + delta
                r, jac = objective.residual_jacobian(x)
                gram, grad = jac.T @ jac, jac.T @ r
                mu *= max(1 / 3, 1 - (2 * actual / predicted - 1) ** 3)
                nu = 2.0
            else:
                mu, nu = mu * nu, 2 * nu
