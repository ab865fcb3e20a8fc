"""Paired intervals and verdicts against hand-computed cases; the pilot gate."""

from __future__ import annotations

import math

import pytest

from experiments.generation.paired import PairedInterval, compare, paired_interval, pilot_gate

T_975_2 = 4.302652729911275  # Student t, 97.5 % quantile, 2 degrees of freedom (tables)


def test_paired_interval_by_hand() -> None:
    # differences 2, 3, 2: mean 7/3, sd sqrt(1/3), half width t * sd / sqrt(3) = t / 3
    mean, low, high = paired_interval([3.0, 5.0, 4.0], [1.0, 2.0, 2.0])
    assert mean == pytest.approx(7 / 3)
    assert low == pytest.approx(7 / 3 - T_975_2 / 3)
    assert high == pytest.approx(7 / 3 + T_975_2 / 3)


def test_pairing_removes_the_seed_effect() -> None:
    # a unpaired spread hides a constant +0.1 gain; pairs make the interval a point
    a, b = [0.2, 0.5, 0.9], [0.1, 0.4, 0.8]
    mean, low, high = paired_interval(a, b)
    assert (mean, low, high) == pytest.approx((0.1, 0.1, 0.1))


def test_paired_interval_refuses_short_or_unequal_samples() -> None:
    with pytest.raises(ValueError, match="equal-length"):
        paired_interval([1.0], [2.0])
    with pytest.raises(ValueError, match="equal-length"):
        paired_interval([1.0, 2.0], [2.0])


@pytest.mark.parametrize(
    ("metric", "low", "high", "verdict"),
    [
        ("consistency", 0.01, 0.2, "better"),
        ("consistency", -0.2, -0.01, "worse"),
        ("consistency", -0.1, 0.1, "no detectable difference"),
        ("fid", -5.0, -1.0, "better"),
        ("fid", 1.0, 5.0, "worse"),
        ("fid", 0.0, 5.0, "no detectable difference"),
    ],
)
def test_verdict_reads_the_metric_direction(
    metric: str, low: float, high: float, verdict: str
) -> None:
    assert PairedInterval("a", "b", metric, 3, (low + high) / 2, low, high).verdict == verdict


def _row(arm: str, seed: int, kappa: float) -> dict:
    return {"definition": {"arm": arm, "seed": seed}, "consistency": kappa, "kappa": kappa}


def test_gate_passes_only_above_zero_with_enough_seeds() -> None:
    rows = [_row("none", s, 0.10 + 0.01 * s) for s in range(3)]
    rows += [_row("self_attention", s, c) for s, c in enumerate([0.30, 0.35, 0.32])]
    gate = pilot_gate(rows)
    assert gate.passed and "passed" in gate.summary
    assert not pilot_gate(rows, min_seeds=4).passed
    flat = rows[:3] + [_row("self_attention", s, c) for s, c in enumerate([0.2, 0.05, 0.1])]
    assert not pilot_gate(flat).passed  # differences +0.1, -0.06, -0.02: interval straddles 0
    assert not pilot_gate([]).passed and "fewer than 2 paired seeds" in pilot_gate([]).summary


def test_compare_uses_only_the_seeds_both_arms_have() -> None:
    rows = [_row("none", 0, 0.1), _row("none", 1, 0.2), _row("none", 2, 0.3)]
    rows += [_row("self_attention", 1, 0.4), _row("self_attention", 2, 0.6)]
    interval = compare(rows, "self_attention", "none", "consistency")
    assert interval is not None and interval.n == 2
    assert interval.mean == pytest.approx(0.25)
    assert math.isfinite(interval.low)
    assert compare(rows[:3], "self_attention", "none", "consistency") is None


def test_gate_with_too_few_seeds_is_incomplete_not_failed() -> None:
    rows = [_row("none", s, 0.1) for s in range(2)] + [
        _row("self_attention", 0, 0.5),
        _row("self_attention", 1, 0.6),
    ]
    gate = pilot_gate(rows)
    assert not gate.complete and not gate.passed and "incomplete" in gate.summary
    assert pilot_gate(rows, min_seeds=2).complete
