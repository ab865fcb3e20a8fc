"""Exceptions and warnings raised by implicit layers, and ``name_the_call``, which annotates
an exception raised inside the user's function with what it was called with."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import Tensor


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


class ExportError(RuntimeError):
    """A layer was exported (``torch.export`` / ``torch.onnx.export``) in a configuration whose
    exported graph would not compute what the layer computes (e.g. initial bases drawn at random,
    or a buffer updated in place); the message names the configuration that exports."""


class NotPositiveDefiniteError(BackwardSolveError):
    """A solver that needs a symmetric positive-definite system (CG) met a direction of
    non-positive curvature: the Hessian is indefinite or singular (not a strict minimum)."""


def name_the_call(
    error: BaseException, where: str, fn: str, z: Sequence[Any], inputs: Sequence[Any]
) -> None:
    """Add a note to an exception raised inside the user's ``fn`` (``f`` of ``fixed_point``,
    the ``loss`` of ``minimize``): the shapes and dtypes it was called with. z has z0's shape
    and dtype, so a mismatch with what ``fn`` expects (a shape, or the dtype of its parameters)
    is a wrong z0 more often than a wrong ``fn``. The exception itself is unchanged (same type
    and message); no note before Python 3.11."""
    if not hasattr(error, "add_note"):
        return

    def describe(t: Any) -> str:
        return f"{tuple(t.shape)} {t.dtype}" if isinstance(t, Tensor) else type(t).__name__

    state = ", ".join(describe(t) for t in z)
    args = ", ".join(describe(a) for a in inputs) or "none"
    error.add_note(
        f"implicit_ham.{where}: raised inside {fn}(z, *args), called with z: {state} (z0's "
        f"shape and dtype) and args: {args}; check that they match what {fn} expects (its "
        "parameters' dtype and device included)" + _batch_hint(z, inputs)
    )


def _batch_hint(z: Sequence[Any], inputs: Sequence[Any]) -> str:
    """A hint when an arg's first dimension differs from z0's batch: an unbatched arg (a weight)
    may do so by design, a batched one means z0 was built for another batch."""
    first = next((t for t in z if isinstance(t, Tensor) and t.ndim), None)
    if first is None:
        return ""
    batch = first.shape[0]
    for i, a in enumerate(inputs):
        if isinstance(a, Tensor) and a.ndim and a.shape[0] != batch:
            return (
                f". z0's batch is {batch} but args[{i}] has {a.shape[0]} rows: if args[{i}] is "
                f"batched, build z0 with {a.shape[0]} rows (e.g. torch.zeros(x.shape[0], ...))"
            )
    return ""
