"""Which gradient should I trust? Each arm's gradient-trust evidence, beside its metric.

Read from what every job recorded (nothing is estimated):

* the backward mode: the job config's ``adjoint._target_``; an arm whose context is not a ham
  and whose jobs recorded no implicit layer (``results.json``'s ``solver``) has none.
* backward passes: training steps (the ``step`` of the last epoch row of ``metrics.jsonl``) x
  implicit layers (``results.json``'s ``solver``) x processes (``world_size``).
* passes at a point that is not a fixed point: the failure events of kind
  ``backward_not_fixed_point`` (``results.json``'s ``failures.by_kind``): an at-fixed-point mode
  (Implicit, Neumann) differentiated where the forward had not converged, so the implicit
  function theorem's gradient does not hold there. Only at-fixed-point modes are checked.
* unconverged backward solves: the ``ConvergenceWarning`` events the library counted from a
  backward solve (``results.json``'s ``events.by_source``, sources named "<mode> backward"),
  at a fixed point or not.
* gradient-fidelity cosines, where a job measured them (``results.json``'s ``fidelity`` rows of
  ``ih.diagnostics.compare_adjoints``, e.g. an ``experiments.grad_study`` job); a training job
  does not measure them.

Each arm gets a one-line reading of that evidence (``reading``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import implicit_ham as ih
from experiments.reports.render import Table
from experiments.reports.sweep import label, metric_cell
from experiments.reports.sweep_jobs import Job, Row
from implicit_ham.adjoints.modes import Adjoint, AtFixedPoint, Unroll
from implicit_ham.decompositions import DECOMPOSITIONS

NOT_FIXED_POINT = "backward_not_fixed_point"
COMPARE = "ih.diagnostics.compare_adjoints or experiments.grad_study"


@dataclass(frozen=True)
class Evidence:
    """One arm's gradient-trust evidence, summed over its ok jobs.

    Attributes:
        mode: the backward mode's name ("" when the arm has no implicit layer).
        kind: "at_fixed_point" (Implicit, Neumann), "unroll", "approximate" (OneStep,
            Truncated, Phantom, ...), "none" (no implicit layer) or "unknown" (a mode this
            report cannot resolve, or no job with a config).
        passes: backward passes through implicit layers (None: a job did not record them).
        not_fixed_point: passes at a point that is not a fixed point (None: not recorded).
        unconverged: backward solves that missed their tolerance (None: not recorded).
        fallback: batches the failure policy gave the one-step gradient instead.
        cosines: (mode, cosine to the reference) of every measured fidelity row.
        jobs: the ok jobs summed.
    """

    mode: str
    kind: str
    passes: int | None
    not_fixed_point: int | None
    unconverged: int | None
    fallback: int
    cosines: tuple[tuple[str, float], ...]
    jobs: int


def _mode(config: Mapping[str, Any]) -> tuple[str, str]:
    adjoint = config.get("adjoint")
    target = adjoint.get("_target_") if isinstance(adjoint, Mapping) else None
    if not isinstance(target, str):
        return "", "unknown"
    name = target.rsplit(".", 1)[-1]
    cls = getattr(ih, name, None) if target.startswith("implicit_ham.") else None
    if not (isinstance(cls, type) and issubclass(cls, Adjoint)):
        return name, "unknown"
    if issubclass(cls, AtFixedPoint):
        return name, "at_fixed_point"
    return name, "unroll" if issubclass(cls, Unroll) else "approximate"


def _passes(job: Job) -> int | None:
    steps = [row["step"] for row in job.history if isinstance(row.get("step"), int)]
    layers = job.record.get("solver")
    world = job.record.get("world_size", 1)
    if not steps or not isinstance(layers, Mapping) or not isinstance(world, int):
        return None
    return max(steps) * len(layers) * world


def _unconverged(job: Job) -> int | None:
    by_source = (job.record.get("events") or {}).get("by_source")
    if not isinstance(by_source, Mapping):
        return None
    return sum(
        int(kinds.get("ConvergenceWarning", 0))
        for source, kinds in by_source.items()
        if str(source).endswith(" backward") and isinstance(kinds, Mapping)
    )


def _cosines(job: Job) -> list[tuple[str, float]]:
    rows = job.record.get("fidelity")
    if not isinstance(rows, list):
        return []
    return [
        (str(r.get("adjoint")), float(r["cosine"]))
        for r in rows
        if isinstance(r, Mapping) and not r.get("reference")
        and isinstance(r.get("cosine"), (int, float))
    ]  # fmt: skip


def cosine_text(cosines: Sequence[tuple[str, float]]) -> str:
    """``"mode 0.250"`` per measured mode (the mean over its jobs, their count in brackets when
    several), in first-seen order."""
    by_mode: dict[str, list[float]] = {}
    for mode, cosine in cosines:
        by_mode.setdefault(mode, []).append(cosine)
    return ", ".join(
        f"{mode} {sum(c) / len(c):.3f}" + (f" ({len(c)} jobs)" if len(c) > 1 else "")
        for mode, c in by_mode.items()
    )


def _total(values: Sequence[int | None]) -> int | None:
    return None if not values or any(v is None for v in values) else sum(v or 0 for v in values)


def evidence(row: Row) -> Evidence:
    """The ``Evidence`` of one arm from its ok jobs' records (module docstring)."""
    jobs = [job for job in row.jobs if job.status == "ok"]
    config = next((job.config for job in row.jobs if job.config), {})
    mode, kind = _mode(config)
    context = (config.get("context") or {}).get("name")
    no_layer = all(not job.record.get("solver") for job in jobs)
    if context is not None and context not in DECOMPOSITIONS.names() and no_layer:
        mode, kind = "", "none"
    recorded = [job for job in jobs if isinstance(job.record.get("failures"), Mapping)]
    return Evidence(
        mode,
        kind,
        _total([_passes(job) for job in jobs]),
        sum(job.failures.get(NOT_FIXED_POINT, 0) for job in recorded) if recorded else None,
        _total([_unconverged(job) for job in jobs]),
        sum(job.actions.get("fallback", 0) for job in jobs),
        tuple(c for job in jobs for c in _cosines(job)),
        len(jobs),
    )


def _share(count: int | None, passes: int | None) -> str:
    if count is None:
        return "not recorded"
    if not passes:
        return f"{count} (of ? passes)"
    return f"{count} of {passes} ({100 * count / passes:.0f}%)"


def reading(e: Evidence) -> str:
    """One line: which gradient this arm's evidence says to trust, and why."""
    if e.jobs == 0:
        return "no ok job: nothing to read"
    if e.kind == "none":
        return "no implicit layer: ordinary backpropagation, nothing to check"
    if e.kind == "unknown":
        return f"backward mode {e.mode or '(not recorded)'} is unknown to this report: no reading"
    measured = f"; measured cosine to the reference: {cosine_text(e.cosines)}" if e.cosines else ""
    if e.kind == "unroll":
        return (
            "trust it as the exact gradient of the K-step forward it ran (no fixed-point "
            f"assumption to check){measured}"
        )
    if e.kind == "approximate":
        return (
            f"an approximate gradient by design ({e.mode}); no check applies"
            + (measured or f"; its fidelity was not measured in this sweep ({COMPARE})")
        )
    if e.not_fixed_point is None:
        return f"{e.mode} assumes a fixed point, but the jobs recorded no failure counts"
    if e.not_fixed_point:
        fell = f" ({e.fallback} fell back to the one-step gradient)" if e.fallback else ""
        return (
            f"do not trust it as the fixed-point gradient: {_share(e.not_fixed_point, e.passes)}"
            f" backward passes were at a point that is not a fixed point{fell}; converge the "
            f"forward (a tolerance, more steps) or use Unroll{measured}"
        )
    if e.unconverged:
        return (
            f"at a fixed point, but {_share(e.unconverged, e.passes)} backward solves missed "
            "their tolerance: the gradient is inaccurate there; raise the backward budget or "
            f"use another linear solver{measured}"
        )
    if e.unconverged is None:
        return f"every pass at a fixed point; backward convergence not recorded{measured}"
    return f"trust it: every backward pass at a fixed point with a converged solve{measured}"


def trust_table(rows: Sequence[Row], keys: Sequence[str], metric: str | None) -> Table:
    """Per arm (labelled by ``keys``): ``metric`` (mean ± std, as the metrics table writes it),
    the backward mode, its passes at a non-fixed point and unconverged backward solves (of all
    backward passes), the measured gradient cosines and the reading."""
    body = []
    for row in rows:
        e = evidence(row)
        checked = e.kind == "at_fixed_point"
        cosines = cosine_text(e.cosines) or "not measured"
        body.append([
            label(row.overrides, keys),
            *([metric_cell(row, metric)] if metric else []),
            e.mode or "none",
            _share(e.not_fixed_point, e.passes) if checked else "n/a",
            _share(e.unconverged, e.passes) if checked else "n/a",
            cosines,
            reading(e),
        ])  # fmt: skip
    header = ["arm", *([metric] if metric else []), "backward mode",
              "passes at a non-fixed point", "unconverged backward solves",
              "gradient cosine", "reading"]  # fmt: skip
    return Table.of(header, body)
