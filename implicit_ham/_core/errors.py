"""Exceptions and warnings raised by implicit layers."""

from __future__ import annotations


class NonFiniteError(RuntimeError):
    """A NaN or infinity appeared in a forward iterate or a backward (adjoint) solve."""


class ConvergenceWarning(UserWarning):
    """A forward or backward solve stopped before reaching its tolerance."""


class ConditioningWarning(UserWarning):
    """``I - J`` at a fixed point is ill-conditioned: implicit gradients there are unreliable."""


class BatchCouplingWarning(UserWarning):
    """A tolerance solve that stopped its samples at different steps replayed its gradient steps
    from each sample's own iterate, and the replay did not reproduce the solve's value: ``f``
    couples the samples (or computes differently with gradient). The value returned is the
    solve's; the gradient is that of the replayed steps."""


class BackwardSolveError(RuntimeError):
    """An implicit backward solve missed its tolerance under ``on_divergence="raise"``."""


class NotFixedPointWarning(ConvergenceWarning):
    """An at-fixed-point backward mode (Implicit, Neumann) was asked to differentiate at a point
    whose residual ``||f(z*) - z*|| / ||f(z*)||`` exceeds its ``fixed_point_tol``."""


class NotFixedPointError(BackwardSolveError):
    """As ``NotFixedPointWarning``, under ``on_divergence="raise"``."""


class SecondOrderError(RuntimeError):
    """A backward mode that cannot give a second derivative was differentiated with
    ``create_graph=True``; it refuses instead of returning a wrong one."""


class ForwardSolveError(RuntimeError):
    """A forward solve missed its tolerance under the training policy ``on_failure="raise"``."""


class NotPositiveDefiniteError(BackwardSolveError):
    """A solver that needs a symmetric positive-definite system (CG) met a direction of
    non-positive curvature: the Hessian is indefinite or singular (not a strict minimum)."""
