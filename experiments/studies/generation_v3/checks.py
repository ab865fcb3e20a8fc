"""Checks of generation v3's rows that the page states beside its answers: the jobs off
their plateau (and whether any answer moves when each is extrapolated), arms whose implicit
layers failed their check on most steps, and re-runs compared with the rows they replace."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from experiments.engine.file_sinks import read_jsonl
from experiments.studies.generation_v3.plan import ARMS, Plan


def rerun_check(path: Path, digest: str) -> str:
    """One sentence on the jobs of plan ``digest`` run more than once in the results file (a
    later row replaces the earlier one): how many re-runs reproduced the held-out loss of the
    row before them bit for bit, and by how much the others moved (per arm, the largest)."""
    if not path.exists():
        return ""
    history: dict[str, list[dict[str, Any]]] = {}
    for row in read_jsonl(path):
        if row["plan"] == digest:
            history.setdefault(row["job"], []).append(row)
    pairs = [(a, b) for rows in history.values() for a, b in itertools.pairwise(rows)]
    if not pairs:
        return ""
    moved: dict[str, float] = {}
    commits = set()
    for before, after in pairs:
        if after["val_loss"] != before["val_loss"]:
            change = abs(after["val_loss"] - before["val_loss"])
            moved[after["arm"]] = max(moved.get(after["arm"], 0.0), change)
            commits.add((before.get("commit") or "not recorded", after.get("commit")))
    same = sum(a["val_loss"] == b["val_loss"] for a, b in pairs)
    said = "; ".join(f"{ARMS[arm][1]} by up to {change:.4f}" for arm, change in moved.items())
    runs = ", ".join(f"{a} to {b}" for a, b in sorted(commits))
    return (
        f"Re-runs: {len(pairs)} rows re-ran a job that already had a row (the later row counts): "
        f"{same} reproduced the held-out loss of the row before them bit for bit"
        + (f"; the others moved ({said}; library commits {runs})." if moved else ".")
    )


def extrapolated(row: Mapping[str, Any], plan: Plan, runs: float = 1.0) -> dict[str, Any]:
    """``row`` with its held-out loss moved on as if its last ``plan.plateau_share`` of training
    went on falling at the same rate for ``runs`` more whole trainings (linear: an optimistic
    bound for a curve that slows down)."""
    losses = [loss for _, loss in row["curve"]]
    back = max(1, round(plan.plateau_share * len(losses)))
    drop = losses[max(0, len(losses) - 1 - back)] - losses[-1]
    return dict(row) | {"val_loss": row["val_loss"] - drop * runs / plan.plateau_share}


def plateau_check(
    rows: Sequence[Mapping[str, Any]],
    plan: Plan,
    verdicts: Callable[[Sequence[Mapping[str, Any]], Plan], Mapping[tuple[str, str], Any]],
) -> str:
    """One sentence: which jobs did not reach a plateau, and whether any of the page's answers
    (``verdicts(rows, plan)``: question -> interval with a ``verdict``, or None; the report's
    ``verdicts``) moves when each of them is extrapolated by another whole training run."""
    mine = [r for r in rows if r["plan"] == plan.digest()]
    late = [r for r in mine if not r["at_plateau"]]
    if not late:
        return f"Every one of the {len(mine)} jobs reached a plateau."
    listed = ", ".join(f"{r['job']} ({100 * (r['plateau_change'] or 0):.1f} %)" for r in late)
    moved = [r if r["at_plateau"] else extrapolated(r, plan) for r in mine]
    said = [{pair: i.verdict if i else "not enough paired seeds" for pair, i in v.items()}
            for v in (verdicts(mine, plan), verdicts(moved, plan))]  # fmt: skip
    changed = [f"{ARMS[a][1]} against {ARMS[b][1]} becomes {now}"
               for (a, b), now in said[1].items() if now != said[0][(a, b)]]  # fmt: skip
    verdict = ("changes none of the answers above" if not changed else
               "changes: " + "; ".join(changed))  # fmt: skip
    return (
        f"{len(late)} of {len(mine)} jobs did not reach a plateau (their change over the last "
        f"fifth: {listed}). Extrapolating each one's last-fifth decline over another whole "
        f"training run (linear, an optimistic bound for a curve that slows down) {verdict}."
    )


def failure_note(rows: Sequence[Mapping[str, Any]], plan: Plan, digest: str, what: str) -> str:
    """One sentence per arm whose jobs (rows of ``digest``) failed an implicit layer's check on
    most of their training steps: how many steps, and what its answers then measure. For the
    implicit gradient that check is the forward state's residual (``backward_not_fixed_point``
    in ``implicit_ham.reliability.failures``): a Hamburger's K-step solve is not a fixed point,
    so the implicit function theorem's gradient is applied where it does not hold."""
    out = []
    for arm in plan.arms:
        mine = [r for r in rows if r["plan"] == digest and r["arm"] == arm]
        failed = sum(int(r.get("failures") or 0) for r in mine)
        steps = sum(int(r.get("steps") or 0) for r in mine)
        if steps and failed > steps / 2:
            out.append(
                f"{ARMS[arm][1]}, {what}: {failed} of its {steps} training steps over "
                f'{len(mine)} jobs were counted as failures by the engine\'s policy ("warn": '
                "training went on); for an implicit gradient that is a forward state whose "
                "residual exceeds the adjoint's fixed-point tolerance (the K-step solve does "
                "not converge), so its answers measure the implicit formula applied at the "
                "solver's last iterate, not the exact gradient of a converged solve."
            )
    return " ".join(out)
