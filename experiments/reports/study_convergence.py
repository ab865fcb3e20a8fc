"""Question 4 of ``docs/results.md``: forward convergence of each decomposition and whether a
converged solve helps the trained model (sections of the study document, from ``study_data``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from experiments.reports.study_data import CONTEXTS, METRICS, DocBase, table
from experiments.reports.study_plots import plot_convergence, plot_eval_solvers


class ConvergenceSections(DocBase):
    """The question-4 section of the study document."""

    # ------------------------------------------------------------------ question 4
    def question4(self) -> list[str]:
        lines = ["## 5. Convergence (legend_seg)", ""]
        conv = self.runs.studies.get("convergence", {})
        if not conv:
            return [*lines, "Not run: the `convergence` studies are missing.", ""]
        body = []
        traces: dict[str, dict[str, Any]] = {}
        for context in CONTEXTS:
            traces[context] = {}
            for point in ("init", "trained"):
                res = self.runs.study("convergence", point, context)
                traces[context][point] = res
                for row in (res or {}).get("convergence", []):
                    tol_key = next((k for k in row if k.startswith("steps_to_")), None)
                    reach = row.get(tol_key) if tol_key else None
                    body.append(
                        [
                            context,
                            point,
                            row["solver"],
                            row["steps"],
                            row["final_rel_residual"],
                            "never" if reach is not None and reach < 0 else reach,
                            row["contraction"],
                            row.get("objective"),
                        ]
                    )
        plot_convergence(traces, self.figure("q4_convergence.png"))
        best = _lowest_residual(traces)
        if best:
            counts = {name: best.count(name) for name in dict.fromkeys(best)}
            ranking = ", ".join(f"{name} in {n}" for name, n in counts.items())
            self.summary.append(
                f"Q4: lowest final residual after `study.max_steps` iterations, per (ham, model): "
                f"{ranking} of {len(best)} cases."
            )
        lines += [
            "Forward solves of the layer's problem on one validation batch with plain "
            "iteration, Anderson and Broyden (`experiments.convergence`, `study.max_steps` "
            'iterations), at initialisation and after training; "iterations to tol": first '
            "iteration with every sample's relative residual ≤ 1e-6:",
            "",
            table(
                [
                    "ham",
                    "model",
                    "solver",
                    "iterations",
                    "final rel. residual",
                    "iterations to tol",
                    "contraction",
                    "objective",
                ],
                body,
            ),
            "",
            self.link("q4_convergence.png", "residual and objective vs iteration"),
            "",
        ]
        return lines + self.eval_solvers({c: traces[c].get("trained") for c in CONTEXTS})

    def eval_solvers(self, trained: Mapping[str, Mapping[str, Any] | None]) -> list[str]:
        body, verdicts = [], []
        for context, res in trained.items():
            rows = (res or {}).get("eval_solvers") or []
            for row in rows:
                body.append(
                    [
                        context,
                        row["solver"],
                        row["final_rel_residual"],
                        *(row.get(m) for m in METRICS),
                    ]
                )
            verdict = _converged_verdict(context, res, rows)
            if verdict:
                verdicts.append(verdict)
        if not body:
            return []
        if verdicts:
            self.summary.append("Q4: " + "; ".join(verdicts) + ".")
        plot_eval_solvers(trained, "val/blob_acc", self.figure("q4_eval_solvers.png"))
        return [
            "**Does a converged solve help the trained model?** Each model trained with BPTT "
            "at K = 6 evaluated with other forward solvers (same weights, same initial bases):",
            "",
            table(["ham", "forward solver", "final rel. residual", *METRICS], body),
            "",
            self.link("q4_eval_solvers.png", "trained models under other forward solvers"),
            "",
            "Blob accuracy at the trained K vs the longest plain solve (one model per ham, seed "
            "0; a change beyond ±0.05 is called help / hurt): " + "; ".join(verdicts) + ".",
            "",
        ]


def _converged_verdict(context: str, res: Any, rows: Sequence[Mapping[str, Any]]) -> str | None:
    """Blob accuracy at the trained K vs the longest plain solve, or None when either is
    missing."""
    k = (res or {}).get("config", {}).get("context", {}).get("eval_steps")
    trained = next((r for r in rows if r["solver"] == f"fixed_point K={k}"), None)
    plain = [r for r in rows if r["solver"].startswith("fixed_point")]
    if trained is None or not plain:
        return None
    longest = max(plain, key=lambda r: int(r["solver"].split("=")[1]))
    before, after = trained.get("val/blob_acc"), longest.get("val/blob_acc")
    if before is None or after is None or longest is trained:
        return None
    delta = after - before
    effect = "helps" if delta > 0.05 else "hurts" if delta < -0.05 else "about the same"
    return f"{context}: K={k} → {longest['solver']} {effect} ({before:.3f} → {after:.3f})"


def _lowest_residual(traces: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """For each (ham, model) convergence study, the solver with the lowest final residual."""
    best = []
    for per_point in traces.values():
        for res in per_point.values():
            rows = [r for r in (res or {}).get("convergence", [])
                    if r.get("final_rel_residual") is not None]  # fmt: skip
            if rows:
                best.append(min(rows, key=lambda r: r["final_rel_residual"])["solver"])
    return best
