"""Paired comparisons of two arms by seed: the mean difference, its t interval, the verdict.

Arms of one seed share the backbone's initial weights and every batch
(``experiments.generation.job``), so the per-seed difference ``a - b`` removes the seed's own
luck; the interval is ``mean(d) +- t_{0.975, n-1} sd(d) / sqrt(n)`` over the n seeds both arms
have. The verdict reads the interval with the metric's direction: "better" when it lies wholly on
the good side of 0, "worse" when wholly on the bad side, "no detectable difference" otherwise.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from scipy import stats

LEVEL = 0.95
HIGHER_IS_BETTER = {"fid": False, "kid": False, "precision": True, "recall": True,
                    "consistency": True, "kappa": True}  # fmt: skip


@dataclass(frozen=True)
class PairedInterval:
    """The paired difference ``a - b`` of one metric over ``n`` seeds."""

    a: str
    b: str
    metric: str
    n: int
    mean: float
    low: float
    high: float

    @property
    def verdict(self) -> str:
        """ "better" / "worse" (for ``a``) / "no detectable difference" (module docstring)."""
        good_high = HIGHER_IS_BETTER[self.metric]
        if self.low > 0:
            return "better" if good_high else "worse"
        if self.high < 0:
            return "worse" if good_high else "better"
        return "no detectable difference"


def paired_interval(
    a: Sequence[float], b: Sequence[float], level: float = LEVEL
) -> tuple[float, float, float]:
    """(mean, low, high) of the paired differences ``a_i - b_i`` (same length n >= 2) with the
    two-sided Student-t interval at ``level``."""
    if len(a) != len(b) or len(a) < 2:
        raise ValueError(
            f"paired_interval: need two equal-length samples of >= 2, got {len(a)}, {len(b)}"
        )
    diffs = [x - y for x, y in zip(a, b, strict=True)]
    mean = statistics.fmean(diffs)
    half = (
        float(stats.t.ppf(0.5 + level / 2, len(diffs) - 1))
        * statistics.stdev(diffs)
        / math.sqrt(len(diffs))
    )
    return mean, mean - half, mean + half


def by_seed(rows: Sequence[Mapping[str, Any]], arm: str, metric: str) -> dict[int, float]:
    """{seed: metric} of ``arm``'s rows (results-file rows)."""
    return {
        int(r["definition"]["seed"]): float(r[metric])
        for r in rows
        if r["definition"]["arm"] == arm
    }


def compare(
    rows: Sequence[Mapping[str, Any]], a: str, b: str, metric: str
) -> PairedInterval | None:
    """The paired interval of ``a - b`` on ``metric`` over the seeds both arms have (None if
    fewer than 2)."""
    values_a, values_b = by_seed(rows, a, metric), by_seed(rows, b, metric)
    seeds = sorted(set(values_a) & set(values_b))
    if len(seeds) < 2:
        return None
    mean, low, high = paired_interval([values_a[s] for s in seeds], [values_b[s] for s in seeds])
    return PairedInterval(a, b, metric, len(seeds), mean, low, high)


@dataclass(frozen=True)
class Gate:
    """The pilot gate: self-attention's agreement kappa minus no context's, paired by seed
    (kappa, not the consistency share: a generator collapsed onto one class has consistency ~1
    and kappa 0)."""

    interval: PairedInterval | None
    min_seeds: int

    @property
    def complete(self) -> bool:
        """Whether both arms have >= ``min_seeds`` paired seeds (the gate can be read)."""
        return self.interval is not None and self.interval.n >= self.min_seeds

    @property
    def passed(self) -> bool:
        """Whether the interval has >= ``min_seeds`` seeds and lies above 0."""
        i = self.interval
        return i is not None and i.n >= self.min_seeds and i.low > 0

    @property
    def summary(self) -> str:
        """One line: the interval and the outcome."""
        i = self.interval
        if i is None:
            return (
                f"fewer than 2 paired seeds of none and self_attention (the gate needs "
                f"{self.min_seeds})"
            )
        outcome = "passed" if self.passed else "failed" if self.complete else "incomplete"
        return (f"kappa(self_attention) - kappa(none) = {i.mean:+.3f}, 95 % interval "
                f"[{i.low:+.3f}, {i.high:+.3f}] over {i.n} seeds: {outcome}")  # fmt: skip


def pilot_gate(rows: Sequence[Mapping[str, Any]], min_seeds: int = 3) -> Gate:
    """The gate of ``rows`` (all seeds of both arms present in the results)."""
    return Gate(compare(rows, "self_attention", "none", "kappa"), min_seeds)
