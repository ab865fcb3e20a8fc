"""Study v4's power arithmetic: the power of a paired non-inferiority test and the replicates
it needs (the budget's side is ``paper_v4.budget``).

Power: a primary comparison is decided non-inferior when the lower end of the 95 % t-interval
of the paired mean difference is above -δ, i.e. the two-sided p-value of ``mean = -δ`` is below
0.05 after Holm over the 3 primary comparisons. Its first (strictest) step needs p < 0.05 / 3,
so ``power`` at ``alpha = 0.05 / 3`` is a lower bound on the power of each comparison when the
true difference is 0 and the paired SD is ``sd``: ``P(T > t_{1 - alpha/2, n-1})`` with T
non-central t, n - 1 degrees of freedom and non-centrality ``δ sqrt(n) / sd``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from scipy import stats

FAMILY = 3  # the primary comparisons (Holm)
LEVEL = 0.05
TARGET_POWER = 0.8


def power(n: int, sd: float, margin: float, alpha: float = LEVEL / FAMILY) -> float:
    """P(the paired t-test rejects ``mean <= -margin`` at two-sided level ``alpha``) for n
    replicates, paired SD ``sd`` and a true mean difference of 0."""
    if n < 2 or not sd > 0:
        raise ValueError(f"power: need n >= 2 and sd > 0, got n={n}, sd={sd}")
    critical = stats.t.ppf(1 - alpha / 2, n - 1)
    return float(stats.nct.sf(critical, n - 1, margin * math.sqrt(n) / sd))


def replicates_for(sd: float, margin: float) -> int | None:
    """The fewest replicates (>= 2) whose ``power`` (Holm's first step) reaches
    ``TARGET_POWER``; None beyond 1000."""
    return next((n for n in range(2, 1001) if power(n, sd, margin) >= TARGET_POWER), None)


def paired_sd(differences: Sequence[float]) -> float | None:
    """The sample SD of paired differences (None below 2)."""
    return statistics.stdev(differences) if len(differences) >= 2 else None
