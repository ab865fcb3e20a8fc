"""Tables of the task-loss gradient studies (``results.json["task_grad"]`` of
``experiments.grad_study``, see ``experiments.studies.task_gradients``) for ``docs/results.md``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from experiments.reports.study_data import table
from experiments.studies.task_gradients import PAPER_ONE_STEP, THROUGH_BASES

REFERENCE_K = 6


def task_grad_lines(studies: Mapping[str, Mapping[str, Any] | None], task: str) -> list[str]:
    """The cosine table (one row per study and mode; cells over K) and a sentence comparing
    the paper's one-step with the through-bases one-step at K = 6. ``studies``: study label
    (e.g. "nmf (init)") -> results.json content or None."""
    body, ks, pairs = [], [], []
    for name, res in studies.items():
        rows = (res or {}).get("task_grad") or []
        if not rows:
            continue
        ks = sorted({r["K"] for r in rows} | set(ks))
        for mode in dict.fromkeys(r["mode"] for r in rows):
            mine = sorted((r for r in rows if r["mode"] == mode), key=lambda r: r["K"])
            body.append(
                [
                    name,
                    mode,
                    " / ".join(_f3(r.get("cosine_same_k")) for r in mine),
                    " / ".join(_f3(r.get("cosine")) for r in mine),
                ]
            )
        at_k = {r["mode"]: r for r in rows if r["K"] == REFERENCE_K}
        if PAPER_ONE_STEP in at_k and THROUGH_BASES in at_k and "unroll" in at_k:
            pairs.append(
                (name, at_k[PAPER_ONE_STEP].get("cosine_same_k"),
                 at_k[THROUGH_BASES].get("cosine_same_k"),
                 _ratio(at_k["unroll"], at_k[PAPER_ONE_STEP]))
            )  # fmt: skip
    if not body:
        return [f"The task-loss gradient studies on {task} are missing.", ""]
    lines = [
        f"**Task-loss gradients on {task}** (what training uses: the model's cross-entropy over "
        "the labelled pixels, differentiated w.r.t. the ham's input X, model in eval mode, "
        "float64, the same initial bases for every mode; `experiments/studies/task_gradients.py`). "
        f"Cosine to BPTT at the same K and to the reference (BPTT to convergence), K = "
        f"{', '.join(map(str, ks))}:",
        "",
        table(["study", "backward", "cosine to BPTT at K", "cosine to reference"], body),
        "",
    ]
    if pairs:
        text = "; ".join(f"{n}: {_f3(a)} vs {_f3(b)}" for n, a, b, _ in pairs)
        norms = "; ".join(f"{n}: {_f3(r)}" for n, _, _, r in pairs)
        lines += [
            f"At K = {REFERENCE_K}, cosine to BPTT of the paper's one-step (bases detached) vs "
            f"the one-step through the last step's bases: {text}. The two differ only by "
            "∂D/∂X, the bases' dependence on the input. Gradient norm of BPTT over the paper's "
            f"one-step at K = {REFERENCE_K}: {norms}.",
            "",
        ]
    return lines


def _ratio(a: Mapping[str, Any], b: Mapping[str, Any]) -> float | None:
    """``a["grad_norm"] / b["grad_norm"]`` (None when either is missing or b's is 0)."""
    num, den = a.get("grad_norm"), b.get("grad_norm")
    return num / den if num is not None and den else None


def _f3(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}"
