"""Non-inferiority verdicts over paired replicates, with Holm's correction over a family.

For a paired difference d = arm − reference per replicate (e.g. one-step − BPTT in test mIoU)
and a margin δ > 0:

* the 95 % t-interval of the mean difference, ``mean ± t_{0.975, n-1} · sd / sqrt(n)``;
* **non-inferior** when its lower bound is above −δ (the arm is at most δ worse, at 95 %),
  **inferior** when its upper bound is below −δ, else **undecided**. An interval inside the
  margin (e.g. [−0.009, −0.001] with δ = 0.01) is non-inferior: the lower bound decides first;
* the same decision as a test: the interval excludes −δ exactly when the two-sided p-value of
  ``H0: mean = −δ`` is below 0.05 (``p_value``), so Holm's step-down procedure over a family
  of verdicts (``holm``) adjusts these p-values, and a verdict stays decided only when its
  adjusted p-value is below 0.05 (its direction unchanged: the side of −δ the mean lies on).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from scipy import stats as scipy_stats

NON_INFERIOR, INFERIOR, UNDECIDED = "non-inferior", "inferior", "undecided"
LEVEL = 0.95


@dataclass(frozen=True)
class Interval:
    """A paired mean difference and its 95 % t-interval (lower == upper == mean when n < 2
    leaves no spread to estimate: then ``verdict`` is undecided)."""

    mean: float
    lower: float
    upper: float
    n: int


def paired_interval(differences: Sequence[float]) -> Interval:
    """The mean of ``differences`` (one per replicate) and its 95 % t-interval."""
    if not differences:
        raise ValueError("paired_interval: no differences (no replicate has both arms)")
    n = len(differences)
    mean = statistics.fmean(differences)
    if n < 2:
        return Interval(mean, -math.inf, math.inf, n)
    half = scipy_stats.t.ppf(0.5 + LEVEL / 2, n - 1) * statistics.stdev(differences) / math.sqrt(n)
    return Interval(mean, mean - half, mean + half, n)


def verdict(interval: Interval, margin: float) -> str:
    """Non-inferior if lower > −margin, inferior if upper < −margin, else undecided."""
    if not margin > 0:
        raise ValueError(f"verdict: margin must be > 0, got {margin!r}")
    if interval.lower > -margin:
        return NON_INFERIOR
    if interval.upper < -margin:
        return INFERIOR
    return UNDECIDED


def p_value(differences: Sequence[float], margin: float) -> float:
    """Two-sided p-value of the paired t-test of ``mean = −margin`` (1 when n < 2; 0 when the
    differences are all equal and differ from −margin)."""
    n = len(differences)
    if n < 2:
        return 1.0
    mean = statistics.fmean(differences)
    se = statistics.stdev(differences) / math.sqrt(n)
    if se == 0:
        return 1.0 if mean == -margin else 0.0
    return float(2 * scipy_stats.t.sf(abs((mean + margin) / se), n - 1))


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the input order: sorted ascending, the i-th
    (0-based) of m is ``max over j <= i of min(1, (m - j) p_(j))``."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[index]))
        adjusted[index] = running
    return adjusted


def holm_verdict(interval: Interval, adjusted_p: float, margin: float) -> str:
    """The verdict after Holm: decided (on the side of −margin the mean lies) only when the
    adjusted p-value is below 1 − LEVEL, else undecided."""
    if adjusted_p >= 1 - LEVEL or interval.n < 2:
        return UNDECIDED
    return NON_INFERIOR if interval.mean > -margin else INFERIOR
