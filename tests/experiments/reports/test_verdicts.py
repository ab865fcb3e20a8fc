"""The non-inferiority verdict rule and Holm's correction against hand-computed cases."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from experiments.reports.verdicts import (
    INFERIOR,
    NON_INFERIOR,
    UNDECIDED,
    Interval,
    holm,
    holm_verdict,
    p_value,
    paired_interval,
    verdict,
)


@pytest.mark.parametrize(
    ("lower", "upper", "expected"),
    [
        (-0.009, -0.001, NON_INFERIOR),  # inside the margin: non-inferior, not refuted
        (-0.009, 0.05, NON_INFERIOR),
        (-0.05, -0.011, INFERIOR),
        (-0.02, -0.001, UNDECIDED),  # reaches below -δ and above it
        (-0.02, 0.02, UNDECIDED),
    ],
)
def test_verdict_reads_the_bounds_against_the_margin(
    lower: float, upper: float, expected: str
) -> None:
    assert verdict(Interval((lower + upper) / 2, lower, upper, 5), 0.01) == expected


def test_paired_interval_by_hand() -> None:
    # mean 0.02, sd sqrt(2) * 0.01, se 0.01, t_{0.975, 1} = 12.7062
    interval = paired_interval([0.01, 0.03])
    assert interval.mean == pytest.approx(0.02)
    assert interval.lower == pytest.approx(0.02 - 12.7062047 * 0.01, abs=1e-6)
    assert interval.upper == pytest.approx(0.02 + 12.7062047 * 0.01, abs=1e-6)
    single = paired_interval([0.5])
    assert single.n == 1 and math.isinf(single.lower) and verdict(single, 0.01) == UNDECIDED


def test_paired_interval_matches_scipys_paired_t_test() -> None:
    a = [0.71, 0.69, 0.74, 0.70, 0.72]
    b = [0.70, 0.70, 0.71, 0.66, 0.70]
    interval = paired_interval([x - y for x, y in zip(a, b, strict=True)])
    low, high = stats.ttest_rel(a, b).confidence_interval(0.95)
    assert interval.n == 5
    assert interval.mean == pytest.approx(sum(a) / 5 - sum(b) / 5)
    assert (interval.lower, interval.upper) == (pytest.approx(low), pytest.approx(high))


def test_p_value_is_below_005_exactly_when_the_interval_excludes_the_margin() -> None:
    rng = np.random.default_rng(0)
    for _ in range(200):
        diffs = list(rng.normal(rng.uniform(-0.04, 0.02), rng.uniform(0.001, 0.03), 5))
        interval, p = paired_interval(diffs), p_value(diffs, 0.01)
        assert (verdict(interval, 0.01) != UNDECIDED) == (p < 0.05)
        # scipy's one-sample t-test of mean = -δ
        assert p == pytest.approx(stats.ttest_1samp(diffs, -0.01).pvalue, rel=1e-9)


def test_holm_by_hand() -> None:
    # sorted: 0.005 -> 4 * 0.005 = 0.02; 0.01 -> 3 * 0.01 = 0.03; 0.03 -> 2 * 0.03 = 0.06;
    # 0.04 -> max(0.06, 1 * 0.04) = 0.06 (monotone)
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.6, 0.5]) == pytest.approx([1.0, 1.0])  # capped at 1
    assert holm([]) == []


def test_holm_verdict_keeps_the_direction_and_undecides_above_005() -> None:
    inside = Interval(-0.005, -0.009, -0.001, 5)
    below = Interval(-0.03, -0.05, -0.011, 5)
    assert holm_verdict(inside, 0.01, 0.01) == NON_INFERIOR
    assert holm_verdict(below, 0.049, 0.01) == INFERIOR
    assert holm_verdict(below, 0.06, 0.01) == UNDECIDED
