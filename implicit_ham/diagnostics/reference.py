"""Which reference gradient ``compare_adjoints`` can vouch for, and why.

Two gradients can serve as the reference of a fidelity table:

* ``Unroll`` through every forward step: the exact derivative of the computation the layer ran
  (a fixed budget of K steps, or wherever a tolerance solve stopped), whether or not it reached
  a fixed point;
* the implicit gradient (``Implicit`` with the dense solver): the derivative of the fixed point
  z*(x), which is the layer's gradient only **at** a fixed point, and only when its backward
  solve converged.

"auto" tries the dense implicit gradient and keeps it only when the library itself vouches for
it: no warning from its fixed-point check, its backward solve or its conditioning check
(``NotFixedPointWarning``, ``ConvergenceWarning``, ``ConditioningWarning``), and every backward
solve it can read (``backward_log`` of a returned ``Solution`` or of a module's
``last_solution``) converged, without fallback, at a point within ``REFERENCE_FIXED_POINT_TOL``.
Otherwise the reference is ``Unroll``, and the reason is given with the numbers.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

from torch import nn

from implicit_ham._core.errors import ConditioningWarning, ConvergenceWarning
from implicit_ham._core.stats import BackwardStats

#: The largest relative forward residual ||f(z*) - z*|| / ||f(z*)|| at which "auto" takes the
#: implicit gradient as the reference (tighter than ``Implicit``'s own default, 1e-3: an
#: implicit gradient at residual r can be off by about r * κ(I - J)).
REFERENCE_FIXED_POINT_TOL = 1e-5

#: The warnings that say an implicit gradient is not to be trusted.
DISTRUST = (ConvergenceWarning, ConditioningWarning)

T = TypeVar("T")


def backward_logs(output: Any, module: nn.Module | None) -> list[BackwardStats]:
    """Every ``BackwardStats`` readable after a backward pass: those of ``output`` when it is a
    ``Solution`` (its ``backward_log``) and of each submodule's ``last_solution``."""
    logs = list(getattr(output, "backward_log", None) or [])
    for sub in [] if module is None else module.modules():
        logs += getattr(getattr(sub, "last_solution", None), "backward_log", None) or []
    return [stats for stats in logs if isinstance(stats, BackwardStats)]


def distrust_of(stats: Sequence[BackwardStats]) -> list[str]:
    """Why these backward solves do not give a trustworthy implicit gradient (empty: no
    objection), with their numbers."""
    reasons = []
    for s in stats:
        if s.fallback:
            reasons.append(
                f"the {s.linear_solver} backward solve fell back to the one-step gradient"
            )
        if s.converged is False:
            if s.cond is not None:  # exact (a dense solve)
                cond = f", κ(I - J) = {s.cond:.2e}"
            elif s.cond_lower_bound is not None:  # GMRES's bound from its Krylov space
                cond = f", κ(I - J) >= {s.cond_lower_bound:.2e}"
            else:
                cond = ""
            reasons.append(
                f"the {s.linear_solver} backward solve did not converge (relative residual "
                f"{s.rel_residual:.2e}{cond})"
            )
        residual = s.forward_residual
        if residual is not None and residual > REFERENCE_FIXED_POINT_TOL:
            reasons.append(
                f"the point is not a fixed point (relative residual {residual:.2e} > "
                f"{REFERENCE_FIXED_POINT_TOL:g})"
            )
    return list(dict.fromkeys(reasons))


@contextmanager
def recording_distrust() -> Iterator[list[str]]:
    """Record, instead of showing, the warnings that distrust an implicit gradient (every event
    of them, whatever the active filters): their first sentences go into the yielded list.
    Other warnings raised in the body are shown as usual."""
    found: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield found
    for item in caught:
        if issubclass(item.category, DISTRUST):
            first = str(item.message).split("; ")[0].split(". ")[0]
            found.append(f"{item.category.__name__}: {first}")
        else:
            warnings.warn_explicit(item.message, item.category, item.filename, item.lineno)
    found[:] = list(dict.fromkeys(found))


def vouch(
    attempt: Callable[[], T], stats_of: Callable[[T], list[BackwardStats]]
) -> tuple[T, list[str]]:
    """Run ``attempt`` (a forward and backward under an implicit mode) while recording the
    distrusting warnings; return its result and the objections (empty: vouched for): those
    its readable backward solves give (``distrust_of``), else the warnings' own words."""
    with recording_distrust() as warned:
        result = attempt()
    return result, distrust_of(stats_of(result)) or warned


def vouched_reason(stats: Sequence[BackwardStats]) -> str:
    """The reason an implicit reference with these backward solves (none readable, or all
    converged at a fixed point) is trusted, with the numbers when they are known."""
    if not stats:
        return (
            "no warning from its fixed-point check (relative residual <= "
            f"{REFERENCE_FIXED_POINT_TOL:g}), backward solve or conditioning check"
        )
    residual = max((s.forward_residual or 0.0) for s in stats)
    conds = [s.cond for s in stats if s.cond is not None]
    cond = f", κ(I - J) = {max(conds):.2e}" if conds else ""
    return (
        f"at a fixed point (relative residual {residual:.2e} <= {REFERENCE_FIXED_POINT_TOL:g}) "
        f"with converged backward solves (relative residual "
        f"{max(s.rel_residual for s in stats):.2e}{cond})"
    )
