"""The section "Argmin hams: does the ridge let the implicit gradient train?" of
``docs/results.md``, from the ``ridge`` sweep (``+experiment=study_ridge``: ``nmf_ridge`` and
``cd_ridge`` x implicit / one_step / unroll) next to plain NMF / CD of the ``adjoints`` sweep at
the paper's K. Every number, setting and verdict is computed from the run outputs, and a
missing sweep or row is named. Rendered by ``templates/study/ridge.md.j2``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from experiments.reports.render import Table, render_beside
from experiments.reports.sweep_jobs import Row, collect_jobs, group_jobs
from experiments.studies.legend_seg.data import (
    REFERENCE_K,
    config_value,
    config_with,
    failure_fraction,
    fmt,
    k_steps,
    mean_std,
    pct,
    select,
)

RIDGE_SWEEP = "ridge"
PAIRS = (("nmf", "nmf_ridge"), ("cd", "cd_ridge"))  # plain ham, its argmin (ridge) version
MODES = ("implicit", "one_step", "unroll")
METRIC = "val/blob_acc"


@dataclass(frozen=True)
class PairVerdict:
    """Whether an argmin ham's implicit arm trains: its blob accuracy (``implicit``, mean ±
    std) within the larger seed std (``noise``) of its own unroll arm's (``unroll``; ``diff``:
    implicit - unroll); beside it the plain ham's implicit arm (``base``, None when missing;
    ``base_diff``: argmin - plain). ``enough`` is False when either argmin arm has no runs."""

    plain: str
    argmin: str
    enough: bool
    trains: bool = False
    implicit: str = ""
    unroll: str = ""
    diff: float = 0.0
    noise: float = 0.0
    base: str | None = None
    base_diff: float | None = None


@dataclass(frozen=True)
class Ridge:
    """The section's data. ``ran``: the ridge sweep has jobs; ``k`` / ``eval_k``: its
    ``context.steps`` / ``context.eval_steps``; ``seeds``: seeds per arm; ``lams``: argmin ham
    -> its ``context.lam``; ``plain_k``: K of the plain hams' rows; ``missing``: arms without
    results."""

    ran: bool
    k: Any
    eval_k: Any
    seeds: str
    lams: tuple[tuple[str, Any], ...]
    plain_k: int
    metric: str
    table: Table
    missing: tuple[str, ...]
    verdicts: tuple[PairVerdict, ...]


def ridge(root: str | Path) -> Ridge:
    """The section's data from the study folder ``root`` (its ``ridge`` and ``adjoints``
    sweeps)."""
    root = Path(root)
    ridge_rows = _rows(root / RIDGE_SWEEP)
    if not ridge_rows:
        return Ridge(False, None, None, "0", (), REFERENCE_K, METRIC, Table.of((), ()), (), ())
    plain = _rows(root / "adjoints")
    arms = {
        (ham, mode): _arm(ridge_rows, plain, ham, mode)
        for pair in PAIRS
        for ham in pair
        for mode in MODES
    }
    config = config_with(ridge_rows, "context")
    body = [[ham, mode, fmt(mean_std(row, METRIC)), fmt(mean_std(row, "val/miou")),
             *_failures(row, mode)] for (ham, mode), row in arms.items()]  # fmt: skip
    header = ["ham", "backward", METRIC, "val/miou", "solve missed", "not at a fixed point"]
    return Ridge(
        ran=True,
        k=config_value(config, "context.steps"),
        eval_k=config_value(config, "context.eval_steps"),
        seeds=" / ".join(map(str, sorted({len(row.jobs) for row in ridge_rows}))),
        lams=tuple(
            (argmin, config_value(config_with(ridge_rows, "context.lam", context=argmin),
                                  "context.lam"))
            for _, argmin in PAIRS
        ),
        plain_k=REFERENCE_K,
        metric=METRIC,
        table=Table.of(header, body),
        missing=tuple(f"{ham} {mode}" for (ham, mode), row in arms.items() if not _has(row)),
        verdicts=tuple(_verdict(arms, plain_ham, argmin) for plain_ham, argmin in PAIRS),
    )


def ridge_section(root: str | Path) -> str:
    """The section alone, as markdown (the study document renders it with the rest)."""
    return render_beside(__file__, "study/ridge_section.md.j2", s=ridge(root))


def _has(row: Row | None) -> bool:
    return mean_std(row, METRIC) is not None


def _rows(folder: Path) -> list[Row]:
    try:
        return group_jobs(collect_jobs(folder))
    except FileNotFoundError:
        return []


def _arm(ridge_rows: list[Row], plain: list[Row], ham: str, mode: str) -> Row | None:
    if ham.endswith("_ridge"):
        return select(ridge_rows, context=ham, adjoint=mode)
    return select(plain, context=ham, adjoint=mode, **k_steps(REFERENCE_K))


def _failures(row: Row | None, mode: str) -> list[str]:
    if mode != "implicit":
        return ["–", "–"]
    kinds = ("backward_not_converged", "backward_not_fixed_point")
    return [pct(failure_fraction(row, kind)) for kind in kinds]


def _verdict(arms: dict[tuple[str, str], Row | None], plain: str, argmin: str) -> PairVerdict:
    implicit = mean_std(arms[(argmin, "implicit")], METRIC)
    unroll = mean_std(arms[(argmin, "unroll")], METRIC)
    if implicit is None or unroll is None:
        return PairVerdict(plain, argmin, enough=False)
    noise = max(implicit[1], unroll[1])
    base = mean_std(arms[(plain, "implicit")], METRIC)
    return PairVerdict(
        plain,
        argmin,
        enough=True,
        trains=implicit[0] >= unroll[0] - noise,
        implicit=fmt(implicit),
        unroll=fmt(unroll),
        diff=implicit[0] - unroll[0],
        noise=noise,
        base=None if base is None else fmt(base),
        base_diff=None if base is None else implicit[0] - base[0],
    )
