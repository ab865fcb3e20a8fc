"""The training-length check of study v3: does training a main arm ``length_factor`` times
longer change its final val mIoU?

Under the poly schedule the learning rate anneals over the last part of every run, so a val
curve still rises at the end of a run even when a longer run ends no higher: the gain over a
run's last quarter measures the annealing, not whether training was long enough. The criterion
is therefore the comparison the question asks for: an arm has trained long enough when its
runs at ``length_factor * main_epochs`` (same replicate, learning rate and schedule shape) end
within ``margin`` of its main runs, on average over the length replicates.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass


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
