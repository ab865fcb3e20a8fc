"""The section "Argmin hams: does the ridge let the implicit gradient train?" of
``docs/results.md``, from the ``ridge`` sweep (``+experiment=study_ridge``: ``nmf_ridge`` and
``cd_ridge`` x implicit / one_step / unroll at K = 6) next to plain NMF / CD of the ``adjoints``
sweep at K = 6. ``experiments/report.py --study`` appends it to the document; every number and
the verdict are computed from the run outputs, and a missing sweep or row is named.
"""

from __future__ import annotations

from pathlib import Path

from experiments.reports.study_data import (
    REFERENCE_K,
    failure_fraction,
    fmt,
    k_steps,
    mean_std,
    pct,
    select,
    table,
)
from experiments.reports.sweep import Row, collect_jobs, group_jobs

TITLE = "## Argmin hams: does the ridge let the implicit gradient train?"
RIDGE_SWEEP = "ridge"
PAIRS = (("nmf", "nmf_ridge"), ("cd", "cd_ridge"))  # plain ham, its argmin (ridge) version
MODES = ("implicit", "one_step", "unroll")
METRIC = "val/blob_acc"


def append_ridge_section(document: str | Path, root: str | Path) -> None:
    """Append the section to ``document`` (the study's results.md) from the study folder
    ``root``."""
    path = Path(document)
    path.write_text(path.read_text() + "\n".join(ridge_section(root)) + "\n")


def ridge_section(root: str | Path) -> list[str]:
    """The section's markdown lines for the study folder ``root`` (its ``ridge`` and
    ``adjoints`` sweeps)."""
    root = Path(root)
    lines = [TITLE, ""]
    ridge = _rows(root / RIDGE_SWEEP)
    if not ridge:
        return [*lines, "Not run: the `ridge` sweep (`+experiment=study_ridge`) is missing.", ""]
    plain = _rows(root / "adjoints")
    arms = {
        (ham, mode): _arm(ridge, plain, ham, mode)
        for pair in PAIRS
        for ham in pair
        for mode in MODES
    }
    lines += [
        f"Argmin hams (docs/optimization_layers.md) trained like the plain hams of question 1 "
        f"(K = {REFERENCE_K} in training and evaluation, three seeds): `nmf_ridge` (projected "
        "gradient on ‖X − DCᵀ‖² + λ(‖D‖² + ‖C‖²), λ = 0.1) and `cd_ridge` (gradient steps on "
        "CD's soft k-means objective with a ridge instead of unit-norm concepts, λ = 1), next "
        f"to plain NMF / CD from the `adjoints` sweep. Final validation metrics, mean ± std "
        "over seeds; the last two columns: share of training steps whose implicit backward "
        "solve missed its tolerance, and whose forward state was not at a fixed point (the "
        "implicit gradient's assumption).",
        "",
        table(
            ["ham", "backward", METRIC, "val/miou", "solve missed", "not at a fixed point"],
            [
                [
                    ham,
                    mode,
                    fmt(mean_std(row, METRIC)),
                    fmt(mean_std(row, "val/miou")),
                    *_failures(row, mode),
                ]
                for (ham, mode), row in arms.items()
            ],
        ),
        "",
    ]
    missing = [f"{ham} {mode}" for (ham, mode), row in arms.items() if not _has(row)]
    if missing:
        lines += [f"**Missing** (not run yet or failed): {', '.join(missing)}.", ""]
    return [*lines, *_verdict(arms), ""]


def _has(row: Row | None) -> bool:
    return mean_std(row, METRIC) is not None


def _rows(folder: Path) -> list[Row]:
    try:
        return group_jobs(collect_jobs(folder))
    except FileNotFoundError:
        return []


def _arm(ridge: list[Row], plain: list[Row], ham: str, mode: str) -> Row | None:
    if ham.endswith("_ridge"):
        return select(ridge, context=ham, adjoint=mode)
    return select(plain, context=ham, adjoint=mode, **k_steps(REFERENCE_K))


def _failures(row: Row | None, mode: str) -> list[str]:
    if mode != "implicit":
        return ["–", "–"]
    kinds = ("backward_not_converged", "backward_not_fixed_point")
    return [pct(failure_fraction(row, kind)) for kind in kinds]


def _verdict(arms: dict[tuple[str, str], Row | None]) -> list[str]:
    """Per pair: whether the argmin ham's implicit arm trains (its blob accuracy within the
    larger seed std of its own unroll arm) and how it compares with the plain ham's."""
    lines = []
    for plain, argmin in PAIRS:
        implicit = mean_std(arms[(argmin, "implicit")], METRIC)
        unroll = mean_std(arms[(argmin, "unroll")], METRIC)
        if implicit is None or unroll is None:
            lines.append(f"- {argmin}: not enough runs for a verdict.")
            continue
        noise = max(implicit[1], unroll[1])
        trains = implicit[0] >= unroll[0] - noise
        sentence = (
            f"- {argmin}: the implicit gradient {'trains' if trains else 'does not train'} as "
            f"well as BPTT through the same ham ({METRIC} {fmt(implicit)} vs unroll "
            f"{fmt(unroll)}, difference {implicit[0] - unroll[0]:+.3f}, seed std up to "
            f"{noise:.3f})"
        )
        base = mean_std(arms[(plain, "implicit")], METRIC)
        if base is None:
            sentence += f"; plain {plain.upper()}'s implicit arm (K = {REFERENCE_K}) is missing."
        else:
            sentence += (
                f"; plain {plain.upper()} with the implicit gradient: {fmt(base)} "
                f"({implicit[0] - base[0]:+.3f} for the argmin ham)."
            )
        lines.append(sentence)
    return ["**Verdict.**", "", *lines]
