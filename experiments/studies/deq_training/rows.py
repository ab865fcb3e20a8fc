"""The DEQ training study's committed rows: one CSV row per finished (arm, seed) job.

``docs/deq_training/runs.csv`` holds each job's numbers (``COLUMNS``): its final test accuracy,
the conditioning of its probes, its solver shares and warnings, its curves (``step:value``
pairs, ``;``-separated), its configuration (JSON), and where it ran (processor, threads,
library commit, torch). The runner appends a row as each job ends (atomic rewrite), skips a
job whose row exists (also on a fresh machine), and the page is rendered from this file alone.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from experiments.studies.csv_rows import decode_curve, encode_curve, read_row_list, write_row_list

WARNING_KINDS = ("NotFixedPointWarning", "ConvergenceWarning", "ConditioningWarning")
CURVES = {  # column -> the probe key it plots (forward_curve: every training step)
    "accuracy_curve": "test_accuracy",
    "rho_curve": "spectral_radius",
    "kappa_curve": "kappa",
}
COLUMNS = (
    "arm", "seed", "final_test_accuracy", "rho_start", "rho_max", "rho_final",
    "first_above_one", "kappa_max", "kappa_final", "forward_steps", "forward_missed",
    "backward_not_fixed_point", "backward_missed", *(f"warnings_{k}" for k in WARNING_KINDS),
    "step_ms", "wall_s", "failure", *CURVES, "forward_curve", "config", "cpu", "threads",
    "commit", "torch",
)  # fmt: skip
TEXT = ("arm", "failure", "config", "cpu", "commit", "torch", *CURVES, "forward_curve")
INTEGER = ("seed", "first_above_one", "threads")
DEFAULT_CSV = Path("docs/deq_training/runs.csv")
Row = dict[str, Any]


def config_text(job_key: Mapping[str, Any]) -> str:
    """A job's configuration as the row stores it (JSON, sorted keys)."""
    return json.dumps(job_key, sort_keys=True)


def _share(steps: Sequence[Mapping[str, Any]], key: str) -> float:
    return sum(not s[key] for s in steps) / len(steps) if steps else math.nan


def mean(values: Sequence[float]) -> float:
    """Mean of the finite values; NaN when there are none."""
    finite = [v for v in values if math.isfinite(v)]
    return statistics.fmean(finite) if finite else math.nan


def job_row(job: Mapping[str, Any], provenance: Mapping[str, Any]) -> Row:
    """The row of a finished job (``run.run_job``'s result) run under ``provenance`` (cpu,
    threads, commit, torch)."""
    steps, probes = job["steps"], job["probes"]
    rho = [p["spectral_radius"] for p in probes]
    kappa = [p["kappa"] for p in probes]
    times = [s["time_s"] for s in steps]
    row: Row = {
        "arm": job["arm"], "seed": int(job["seed"]),
        "final_test_accuracy": job["final_test_accuracy"],
        "rho_start": rho[0], "rho_max": max(rho), "rho_final": rho[-1],
        "first_above_one": next((p["step"] for p in probes if p["spectral_radius"] > 1), None),
        "kappa_max": max(kappa), "kappa_final": kappa[-1],
        "forward_steps": mean([s["forward_steps"] for s in steps]),
        "forward_missed": _share(steps, "forward_converged"),
        "backward_not_fixed_point": _share(steps, "backward_at_fixed_point"),
        "backward_missed": _share(steps, "backward_converged"),
        "step_ms": 1e3 * statistics.median(times) if times else math.nan,
        "wall_s": job["wall_s"], "failure": job["failure"] or "",
        "forward_curve": encode_curve((s["step"], s["forward_steps"]) for s in steps),
        "config": config_text(job["config"]),
        **{k: provenance.get(k) for k in ("cpu", "threads", "commit", "torch")},
    }  # fmt: skip
    for kind in WARNING_KINDS:
        row[f"warnings_{kind}"] = float(sum(s["warnings"].get(kind, 0) for s in steps))
    for column, key in CURVES.items():
        row[column] = encode_curve((p["step"], p[key]) for p in probes)
    return row


def curve(row: Mapping[str, Any], column: str) -> list[tuple[int, float]]:
    """A row's curve as (step, value) pairs."""
    return decode_curve(row.get(column))


def _parse(column: str, text: str) -> Any:
    if column in TEXT:
        return text
    if text == "":
        return None
    return int(text) if column in INTEGER else float(text)


def read_rows(path: str | Path) -> list[Row]:
    """The CSV's rows, typed, in file order; [] when the file does not exist."""
    return read_row_list(path, COLUMNS, _parse)


def append_row(path: str | Path, row: Mapping[str, Any]) -> None:
    """Add ``row`` to the CSV (replacing a row of the same arm and seed), rewritten atomically."""
    kept = [r for r in read_rows(path) if (r["arm"], r["seed"]) != (row["arm"], row["seed"])]
    write_row_list(path, [*kept, row], COLUMNS)
