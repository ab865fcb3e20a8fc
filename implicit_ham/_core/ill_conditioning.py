"""The one ``ConditioningWarning`` of the library: ``κ(I - J)`` above a threshold.

Two places measure the condition number of the system an implicit gradient solves: the backward
pass (``Implicit``'s linear solver reports it, ``adjoints.backward_check.finish_backward``)
and the diagnostics (``diagnostics.conditioning.warn_if_ill_conditioned``, from a
``ConditioningReport``). Both warn through ``warn_ill_conditioned``, so the message, its numbers
and its advice are the same wherever the number came from.
"""

from __future__ import annotations

from implicit_ham._core.errors import ConditioningWarning
from implicit_ham._core.events import events


def warn_ill_conditioned(
    where: str,
    kappa: float,
    threshold: float | None,
    evidence: str,
    *,
    label: str = "I - J",
    exact: bool = False,
    residual: float | None = None,
) -> bool:
    """Warn ``ConditioningWarning`` when ``kappa > threshold``; return whether it warned.

    Args:
        where: who measured, first in the message (e.g. "Implicit backward", a layer's name).
        kappa: the (lower-bound) estimate of ``κ(label)``; NaN never warns (no evidence).
        threshold: the largest accepted κ; None disables the warning.
        evidence: what the number came from, in parentheses after it (the linear solver's
            name, or the diagnostics' singular values and spectral radius).
        label: the system's name: "I - J" for a fixed point, e.g. "dg/dz" for a root.
        exact: kappa is κ itself (a dense solve), not a lower bound.
        residual: the solve's relative residual; with it the message gives the error bound
            ``κ * residual`` of the solution (relative, an upper bound when κ is exact).
    """
    if threshold is None or not kappa > threshold:
        return False
    bound = "" if residual is None else f", error bound κ * residual = {kappa * residual:.1e}"
    events().warn(
        f"{where}: κ({label}) {'=' if exact else '>='} {kappa:.3e} exceeds {threshold:.1e} "
        f"({evidence}{bound}); implicit "
        f"gradients ({label})^-T v are unreliable here. A continuum of fixed points (e.g. "
        "NMF's scaling symmetry) causes this: use OneStep, Phantom or Unroll, or regularise "
        "the map. Unknowns whose sizes differ by orders of magnitude (e.g. a curve fit's "
        "amplitude and rate) also raise κ: rescale them so that they are of order one.",
        ConditioningWarning,
        residual=kappa,
        where=where,
    )
    return True
