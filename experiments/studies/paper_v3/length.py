"""The training-length section of study v3: does training a main arm ``length_factor`` times
longer change its final val mIoU (``length_check``, the criterion), does it move a verdict's
comparison across ``±δ`` (``comparison_at_length``), and how much does its val curve still gain
within a run (``flatness``, context)?

Under the poly schedule the learning rate anneals over the last part of every run, so a val
curve still rises at the end of a run even when a longer run ends no higher: the gain over a
run's last quarter measures the annealing, not whether training was long enough. The criterion
is therefore the comparison the question asks for: an arm has trained long enough when its
runs at ``length_factor * main_epochs`` (same replicate, learning rate and schedule shape) end
within ``margin`` of its main runs, on average over the length replicates.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from experiments.studies.csv_rows import decode_curve

FLAT_TAIL = 0.25  # the share of training at the end over which a run's tail gain is measured


@dataclass(frozen=True)
class LengthCheck:
    """One arm's pairs (replicate, final val mIoU of the main run, of the longer run)."""

    pairs: tuple[tuple[int, float, float], ...]
    margin: float

    @property
    def deltas(self) -> tuple[float, ...]:
        """Per pair: longer run's final val mIoU minus the main run's."""
        return tuple(long - short for _, short, long in self.pairs)

    @property
    def mean_delta(self) -> float:
        return statistics.fmean(self.deltas)

    @property
    def converged(self) -> bool:
        """The longer runs end within ``margin`` of the main runs (mean over the pairs)."""
        return abs(self.mean_delta) < self.margin

    def row(self, label: str) -> tuple[str, ...]:
        """(arm, pairs, mean final val at each length, mean change, each change, verdict)."""
        short = statistics.fmean(s for _, s, _ in self.pairs)
        long = statistics.fmean(lg for _, _, lg in self.pairs)
        each = ", ".join(f"r{r}: {d:+.3f}" for (r, _, _), d in zip(self.pairs, self.deltas,
                                                                    strict=True))  # fmt: skip
        return (label, str(len(self.pairs)), f"{short:.3f}", f"{long:.3f}",
                f"{self.mean_delta:+.3f}", each, "yes" if self.converged else "no")  # fmt: skip


def length_check(
    short: Mapping[int, float], long: Mapping[int, float], margin: float
) -> LengthCheck | None:
    """The check from each length's final val mIoU per replicate (None: no replicate has
    both)."""
    pairs = tuple((r, short[r], long[r]) for r in sorted(short.keys() & long.keys()))
    return LengthCheck(pairs, margin) if pairs else None


Curve = tuple[tuple[int, float], ...]  # [(training step, value)]


def tail_gain(curve: Sequence[tuple[int, float]]) -> float | None:
    """Val mIoU gained over the last ``FLAT_TAIL`` of a curve [(step, value)]: the final value
    minus the last value at or before ``(1 - FLAT_TAIL)`` of the final step (None: too short)."""
    if len(curve) < 2:
        return None
    cut = curve[-1][0] * (1 - FLAT_TAIL)
    before = [v for s, v in curve if s <= cut]
    return curve[-1][1] - before[-1] if before else None


def tail_jitter(curve: Sequence[tuple[int, float]]) -> list[float]:
    """The absolute epoch-to-epoch changes of a curve in its last ``FLAT_TAIL``."""
    cut = curve[-1][0] * (1 - FLAT_TAIL) if curve else 0
    tail = [v for s, v in curve if s >= cut]
    return [abs(b - a) for a, b in itertools.pairwise(tail)]


def mean_curve(curves: Sequence[Sequence[tuple[int, float]]]) -> list[tuple[int, float]]:
    """The pointwise mean of an arm's val curves over the steps every curve has."""
    common = set.intersection(*(set(s for s, _ in c) for c in curves)) if curves else set()
    values = [dict(c) for c in curves]
    return [(s, statistics.fmean(v[s] for v in values)) for s in sorted(common)]


@dataclass(frozen=True)
class Flatness:
    """The flattening check of one arm: its mean val curve over replicates, that curve's gain
    in the last ``FLAT_TAIL`` of training, each run's own gain and the runs' epoch-to-epoch
    changes in that tail."""

    curve: Curve
    mean_gain: float
    run_gains: tuple[float, ...]
    jitter: tuple[float, ...]

    margin: float

    @property
    def flat(self) -> bool:
        """The arm's mean curve gained less than ``margin`` over the last ``FLAT_TAIL``."""
        return self.mean_gain < self.margin

    def row(self, label: str) -> tuple[str, ...]:
        runs = sum(g < self.margin for g in self.run_gains)
        return (label, f"{self.mean_gain:+.3f}", f"{min(self.run_gains):+.3f}",
                f"{max(self.run_gains):+.3f}", f"{runs} of {len(self.run_gains)}",
                "yes" if self.flat else "no")  # fmt: skip


def flatness(rows: Sequence[Mapping[str, Any]], margin: float) -> Flatness | None:
    """The check over an arm's ok rows (None: no row has a curve long enough)."""
    curves = [c for r in rows if len(c := decode_curve(r.get("val_curve"))) >= 2]
    gains = [g for c in curves if (g := tail_gain(c)) is not None]
    mean = tuple(mean_curve(curves))
    mean_gain = tail_gain(mean)
    if not gains or mean_gain is None:
        return None
    jitter = tuple(d for c in curves for d in tail_jitter(c))
    return Flatness(mean, mean_gain, tuple(gains), jitter, margin)


def side(difference: float, margin: float) -> str:
    """Where a difference lies against ``±margin``: "worse" (below ``-margin``), "better"
    (above ``margin``) or "within δ"."""
    if difference < -margin:
        return "worse"
    return "better" if difference > margin else "within δ"


@dataclass(frozen=True)
class ComparisonAtLength:
    """One verdict's comparison (arm − BPTT, test mIoU, paired by replicate) on the length
    replicates, after the main training and after the longer one: does longer training move
    it to the other side of ``±margin``? Descriptive (the length replicates only), not a
    verdict."""

    pairs: tuple[tuple[int, float, float], ...]  # (replicate, difference main, longer)
    margin: float

    @property
    def main(self) -> float:
        return statistics.fmean(d for _, d, _ in self.pairs)

    @property
    def longer(self) -> float:
        return statistics.fmean(d for _, _, d in self.pairs)

    @property
    def same_side(self) -> bool:
        return side(self.main, self.margin) == side(self.longer, self.margin)

    def row(self, *labels: str) -> tuple[str, ...]:
        """(labels..., pairs, mean difference and its side at each length, same side)."""
        return (*labels, str(len(self.pairs)), f"{self.main:+.3f} ({side(self.main, self.margin)})",
                f"{self.longer:+.3f} ({side(self.longer, self.margin)})",
                "yes" if self.same_side else "no")  # fmt: skip


def comparison_at_length(
    arm: Mapping[int, float],
    reference: Mapping[int, float],
    arm_longer: Mapping[int, float],
    reference_longer: Mapping[int, float],
    margin: float,
) -> ComparisonAtLength | None:
    """The comparison from the four arms' scores per replicate (main and longer runs of the
    arm and of its reference); None when no replicate has all four."""
    both = arm.keys() & reference.keys() & arm_longer.keys() & reference_longer.keys()
    pairs = tuple((r, arm[r] - reference[r], arm_longer[r] - reference_longer[r])
                  for r in sorted(both))  # fmt: skip
    return ComparisonAtLength(pairs, margin) if pairs else None
