"""The drift of study v4's metrics between two runs of the same job: each row of the re-runs
sidecar (``paper_v4.rerun``) against the study's row of that job. On two processor models it
is the drift across machines; on the same model and thread count the metrics should be
identical bit for bit. Only measured pairs are reported: none, and the page says so."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from experiments.reports.render import Table

# every column a job computes (the rest: its identity, timing and provenance)
METRICS = ("steps", "val_miou", "val_pixel_acc", "val_loss", "test_miou", "test_pixel_acc",
           "test_loss", "val_curve", "fidelity")  # fmt: skip
NUMERIC = ("val_miou", "val_pixel_acc", "val_loss", "test_miou", "test_pixel_acc", "test_loss")
RERUN_COMMAND = "OMP_NUM_THREADS=1 python -m experiments.studies.paper_v4.rerun --csv {csv} JOB ..."


def _machine(row: Mapping[str, Any]) -> tuple[str, str]:
    return str(row.get("cpu") or "unknown"), str(row.get("threads") or "–")


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


@dataclass(frozen=True)
class Pair:
    """A job's study row and one re-run of it."""

    job: str
    study: Mapping[str, Any]
    rerun: Mapping[str, Any]

    @property
    def same_machine(self) -> bool:
        """Same processor model and thread count."""
        return _machine(self.study) == _machine(self.rerun)

    @property
    def metric(self) -> str:
        """The compared headline metric: test mIoU; a pretraining row's val pixel accuracy."""
        return "test_miou" if self.study.get("test_miou") is not None else "val_pixel_acc"

    @property
    def delta(self) -> float | None:
        """Re-run − study on ``metric`` (None where either is missing)."""
        a, b = self.study.get(self.metric), self.rerun.get(self.metric)
        if a is None or b is None or not (_finite(a) and _finite(b)):
            return None
        return float(b) - float(a)

    @property
    def identical(self) -> bool:
        """Every column of ``METRICS`` equal (the curves as stored)."""
        return all(self.study.get(c) == self.rerun.get(c) for c in METRICS)

    @property
    def largest(self) -> float:
        """The largest |re-run − study| over the numeric metrics both rows have."""
        diffs = [abs(float(self.rerun[c]) - float(self.study[c])) for c in NUMERIC
                 if _finite(self.study.get(c)) and _finite(self.rerun.get(c))]  # fmt: skip
        return max(diffs, default=0.0)


def pairs(rows: Mapping[str, Mapping[str, Any]], reruns: Sequence[Mapping[str, Any]],
          digest: str) -> list[Pair]:  # fmt: skip
    """Every ``ok`` re-run of plan ``digest`` whose job has an ``ok`` study row."""
    out = []
    for again in reruns:
        study = rows.get(str(again.get("job")))
        if (again.get("status") == "ok" and again.get("plan") == digest and study is not None
                and study.get("status") == "ok"):  # fmt: skip
            out.append(Pair(str(again["job"]), study, again))
    return out


def drift_table(measured: Sequence[Pair]) -> Table:
    """One line per re-run: where each ran, the headline metric of both and their difference,
    the largest difference over every numeric metric, and whether all metrics are equal."""
    return Table.of(
        ["job", "study row: processor, threads", "re-run: processor, threads", "metric",
         "study", "re-run", "re-run − study", "largest abs. difference", "bit-identical"],
        [(p.job, ", ".join(_machine(p.study)), ", ".join(_machine(p.rerun)),
          p.metric.replace("_", " "), f"{p.study.get(p.metric)!r}", f"{p.rerun.get(p.metric)!r}",
          "–" if p.delta is None else f"{p.delta:+.2e}", f"{p.largest:.2e}",
          "yes" if p.identical else "no") for p in measured],
    )  # fmt: skip


def _spread(values: Sequence[float], name: str, margin: float) -> str:
    size = [abs(v) for v in values]
    jobs = f"{len(size)} job{'s' if len(size) > 1 else ''}"
    return (f"|Δ {name}| mean {statistics.fmean(size):.2e}, largest {max(size):.2e} over "
            f"{jobs} (the margin δ = {margin:g})")  # fmt: skip


def drift_summary(measured: Sequence[Pair], rows: Mapping[str, Mapping[str, Any]], csv: str,
                  margin: float) -> str:  # fmt: skip
    """What the re-runs measure, in sentences (no re-run: says that the drift is unmeasured,
    and how to measure it)."""
    cpus = sorted({_machine(r)[0] for r in rows.values()})
    how = (f"Re-run finished jobs on another machine with `{RERUN_COMMAND.format(csv=csv)}` "
           "(rows go to the re-runs sidecar beside the CSV) and regenerate this page.")  # fmt: skip
    if not measured:
        where = (f"the study's {len(rows)} rows ran on {len(cpus)} processor model"
                 f"{'s' if len(cpus) != 1 else ''} ({'; '.join(cpus)})" if rows
                 else "the study has no rows yet")  # fmt: skip
        return (
            f"No job has been re-run yet ({where}): the drift across machines is not "
            f"measured, and a replicate's arms may come from different machines. {how}"
        )
    across = [p for p in measured if not p.same_machine]
    same = [p for p in measured if p.same_machine]
    out = []
    if across:
        machines = sorted({f"{_machine(p.study)[0]} → {_machine(p.rerun)[0]}" for p in across})
        train = [p.delta for p in across if p.metric == "test_miou" and p.delta is not None]
        pre = [p.delta for p in across if p.metric == "val_pixel_acc" and p.delta is not None]
        parts = [_spread(train, "test mIoU", margin)] if train else []
        parts += [_spread(pre, "pretraining val pixel accuracy", margin)] if pre else []
        identical = sum(p.identical for p in across)
        out.append(f"Drift across machines ({'; '.join(machines)}), {len(across)} re-run"
                   f"{'s' if len(across) > 1 else ''}: " + "; ".join(parts or ["no metric"])
                   + f"; {identical} of {len(across)} bit-identical.")  # fmt: skip
    else:
        out.append(f"No job has been re-run on another processor model: the drift across "
                   f"machines is not measured. {how}")  # fmt: skip
    if same:
        identical = sum(p.identical for p in same)
        jobs = len({p.job for p in same})
        many = "s" if len(same) != 1 else ""
        out.append(f"Re-runs on the same processor model and thread count ({len(same)} "
                   f"comparison{many} of {jobs} job{'s' if jobs != 1 else ''}): {identical} of "
                   f"{len(same)} bit-identical in every metric"
                   + ("." if identical == len(same) else
                      f" (largest |difference| {max(p.largest for p in same):.2e}).")
                   )  # fmt: skip
    return " ".join(out)
