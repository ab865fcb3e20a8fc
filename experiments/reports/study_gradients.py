"""Question 2 of ``docs/results.md``: gradient conditioning, BPTT norms and cosines vs K, and
the remedies for NMF's singular I - J (sections of the study document, from ``study_data``)."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

from experiments.reports.study_data import (
    CONTEXTS,
    METRICS,
    REFERENCE_K,
    DocBase,
    failure_fraction,
    fmt,
    k_steps,
    mean_std,
    pct,
    select,
    table,
)
from experiments.reports.study_plots import plot_grad_study
from experiments.reports.study_task_grad import task_grad_lines

REMEDY_MODES = ("implicit", "implicit(ridge=0.1)")


class GradientSections(DocBase):
    """The question-2 section of the study document."""

    # ------------------------------------------------------------------ question 2
    def question2(self) -> list[str]:
        lines = ["## 3. Gradient conditioning (legend_seg)", ""]
        grad = self.runs.studies.get("grad", {})
        if not grad:
            return [*lines, "Not run: the `grad` studies are missing.", "", *self.remedy()]
        lines += [
            "`experiments.grad_study` on the model's Hamburger layer (one validation image, "
            "float64), at initialisation and after training (BPTT, K = 6, seed 0). The loss is "
            "a fixed random weighting of the layer's readout D C^T, which NMF's scaling "
            "symmetry leaves unchanged, so all gradients compared are well defined. Reference "
            "gradient: BPTT through `study.reference_steps` iterations. In these raw-problem "
            "tables `one_step` differentiates the layer's last iteration, bases included (hence "
            "cosine 1.000 to BPTT at K = 1): it is the one-step *through the last step's "
            "bases*, not the paper's detached-bases gradient that section 2 trains with; the "
            "task-loss table after them measures both.",
            "",
            "**Conditioning of I - J** (J: the iteration's Jacobian; Arnoldi / Lanczos / inverse "
            "iteration on Jacobian-vector products, so κ is a lower bound), at the K-step state "
            "and after the reference number of iterations:",
            "",
        ]
        body = []
        for context in (*CONTEXTS, "nmf_normalized"):
            for point in ("init", "trained"):
                res = self.runs.study("grad", point, context)
                for row in (res or {}).get("conditioning", []):
                    body.append(
                        [
                            context,
                            point,
                            row["point"],
                            row["steps"],
                            row.get("fixed_point_residual"),
                            row.get("spectral_radius"),
                            row.get("sigma_min"),
                            _kappa(row),
                        ]
                    )
        lines += [
            table(
                [
                    "ham",
                    "model",
                    "state",
                    "iterations",
                    "rel. residual",
                    "spectral radius",
                    "σ_min(I − J)",
                    "κ(I − J) ≥",
                ],
                body,
            ),
            "",
        ]
        lines += self.grad_tables()
        lines += self.remedy()
        return lines

    def grad_tables(self) -> list[str]:
        lines: list[str] = []
        norms: list[list[Any]] = []
        cosines: list[list[Any]] = []
        ks: list[int] = []
        for context in (*CONTEXTS, "nmf_normalized"):
            results = {p: self.runs.study("grad", p, context) for p in ("init", "trained")}
            for point, res in results.items():
                if not res:
                    continue
                unroll = [r for r in res["grad_vs_k"] if r["adjoint"] == "unroll"]
                by_k = {r["K"]: r.get("grad_norm") for r in unroll}
                norms.append([context, point, by_k])
                ks = sorted(set(ks) | set(by_k))
                for mode in _modes(res):
                    rows = [r for r in res["grad_vs_k"] if r["adjoint"] == mode]
                    same = " / ".join(_f3(r.get("cosine_same_k")) for r in rows)
                    ref = " / ".join(_f3(r.get("cosine")) for r in rows)
                    cosines.append([context, point, mode, same, ref])
            if any(results.values()):
                name = f"q2_grad_{context}.png"
                plot_grad_study(results, context, self.figure(name))
                lines.append(self.link(name, f"gradient study, {context}"))
        ks_text = ", ".join(map(str, ks))
        spread = [_ratio(by_k, ks) for *_, by_k in norms]
        norm_rows = [
            [c, p, *(by_k.get(k) for k in ks), r]
            for (c, p, by_k), r in zip(norms, spread, strict=True)
        ]
        ratios = [r for r in spread if r is not None]
        if ratios:
            wide = [f"{c} ({p}) {r:.3g}" for (c, p, _), r in zip(norms, spread, strict=True)
                    if r is not None and r > 10]  # fmt: skip
            self.summary.append(
                f"Q2: over K = {ks_text}, the BPTT gradient norm of each (ham, model) varies by a "
                f"factor {min(ratios):.2g}–{max(ratios):.2g} (largest / smallest over K); above "
                f"10: {', '.join(wide) if wide else 'none'}. " + self.closer_than_bptt()
            )
        return [
            f"**BPTT gradient norm vs K** (K = {ks_text}; last column: the largest norm over "
            "the smallest):",
            "",
            table(["ham", "model", *(f"K={k}" for k in ks), "ratio"], norm_rows),
            "",
            _swings(norms, ks),
            "",
            f"**Cosine of each backward mode's gradient** to the exact gradient of the K-step "
            f"map (BPTT at the same K) and to the reference gradient, at K = {ks_text}:",
            "",
            table(
                ["ham", "model", "backward", "cosine to BPTT at K", "cosine to reference"], cosines
            ),
            "",
            *lines,
            "",
            *task_grad_lines(
                {
                    f"{c} ({p})": self.runs.study("grad", p, c)
                    for c in CONTEXTS
                    for p in ("init", "trained")
                },
                "legend_seg (init and BPTT-trained seed 0)",
            ),
        ]

    def remedy(self) -> list[str]:
        lines = [
            "### NMF's scaling symmetry and two remedies",
            "",
            "NMF's multiplicative updates map (D M, C M^-T) to (D' M, C' M^-T) for positive "
            "diagonal M, and at an interior solution every invertible M near I gives an equally "
            "good factorisation: the fixed points form a family, J has eigenvalues at 1 along "
            "it and I − J is singular (tests/lib/decompositions/test_nmf_normalized.py counts r² "
            "unit eigenvalues for NMF and r² − r with unit-norm bases). Remedies measured: "
            "`nmf_normalized` (unit-norm bases after every step: same output, removes the r "
            "scalings) and `Implicit(ridge=λ)` (solve g = J^T g / (1 + λ) + v, a discounted "
            "Neumann series between the implicit gradient (λ = 0) and, as λ → ∞, the one-step "
            "gradient through the last step's bases, not the paper's detached-bases one).",
            "",
        ]
        lines += self.remedy_conditioning()
        rows = self.runs.rows("remedy")
        if not rows:
            return [*lines, "The `remedy` sweep is missing.", ""]
        body, scored = [], []
        for context in ("nmf", "nmf_normalized"):
            for ridge in ("0.0", "0.1", "1.0"):
                row = select(rows, context=context, **{"adjoint.ridge": ridge})
                stats = [mean_std(row, m) for m in METRICS]
                body.append([context, ridge, *map(fmt, stats), pct(failure_fraction(row))])
                if stats[0] is not None and (context, ridge) != ("nmf", "0.0"):
                    scored.append((stats[0], context, ridge))  # plain NMF, λ = 0: the baseline
        unroll = mean_std(
            select(self.adjoint_rows, context="nmf", adjoint="unroll", **k_steps(REFERENCE_K)),
            "val/blob_acc",
        )
        if not scored:
            return [*lines, "The `remedy` sweep has no successful job.", ""]
        baseline = mean_std(select(rows, context="nmf", **{"adjoint.ridge": "0.0"}), "val/blob_acc")
        best = max(scored, key=lambda item: item[0][0])
        self.summary.append(
            f"Q2 remedy: best implicit-gradient NMF arm `{best[1]}` λ = {best[2]}, blob accuracy "
            f"{fmt(best[0])}, vs {fmt(baseline)} for the exact implicit gradient (λ = 0) and "
            f"{fmt(unroll)} with BPTT."
        )
        return [
            *lines,
            f"Trained with the implicit gradient at K = 6 ({_seeds(rows)} seeds; `nmf` with "
            "λ = 0 is the unremedied baseline):",
            "",
            table(["ham", "ridge λ", *METRICS, "backward missed tol"], body),
            "",
            f"Best remedy arm by blob accuracy: `{best[1]}` with λ = {best[2]} ({fmt(best[0])}); "
            f"NMF with BPTT at K = {REFERENCE_K} reaches {fmt(unroll)}.",
            "",
        ]

    def remedy_conditioning(self) -> list[str]:
        """NMF vs unit-norm-bases NMF at initialisation: conditioning after the reference
        iterations and the implicit gradients' cosine to BPTT at K = REFERENCE_K."""
        body = []
        for context in ("nmf", "nmf_normalized"):
            res = self.runs.study("grad", "init", context)
            if not res:
                continue
            conv = next((r for r in res.get("conditioning", []) if r["point"] == "converged"), {})
            at_k = {r["adjoint"]: r for r in res["grad_vs_k"] if r["K"] == REFERENCE_K}
            body.append(
                [
                    context,
                    conv.get("spectral_radius"),
                    conv.get("kappa"),
                    *(at_k.get(mode, {}).get("cosine_same_k") for mode in REMEDY_MODES),
                ]
            )
        if not body:
            return []
        return [
            f"At initialisation (grad studies): conditioning after the reference iterations, "
            f"and the cosine of the implicit gradients to BPTT at K = {REFERENCE_K}:",
            "",
            table(
                ["ham", "spectral radius", "κ(I − J) ≥", *(f"cosine {m}" for m in REMEDY_MODES)],
                body,
            ),
            "",
        ]

    def closer_than_bptt(self) -> str:
        """Sentence: at K = REFERENCE_K, in how many (ham, model) studies the one-step gradient
        is closer to the reference (converged) gradient than BPTT's."""
        closer, pairs = [], 0
        for context in CONTEXTS:
            for point in ("init", "trained"):
                res = self.runs.study("grad", point, context)
                at_k = {r["adjoint"]: r.get("cosine") for r in (res or {}).get("grad_vs_k", [])
                        if r["K"] == REFERENCE_K}  # fmt: skip
                if at_k.get("unroll") is None or at_k.get("one_step") is None:
                    continue
                pairs += 1
                if at_k["one_step"] > at_k["unroll"]:
                    closer.append(f"{context} ({point})")
        if not pairs:
            return ""
        return (
            f"At K = {REFERENCE_K} the one-step gradient is closer (cosine) than BPTT's to the "
            f"reference gradient in {len(closer)} of {pairs} studies"
            + (f": {', '.join(closer)}." if closer else ".")
        )


def _swings(norms: Sequence[Sequence[Any]], ks: Sequence[int]) -> str:
    """Sentence: which (ham, model) rows have a BPTT gradient norm that is not monotone in K
    (it swings up and down) and which grow or shrink steadily."""
    swinging, steady = [], []
    for context, point, by_k in norms:
        values = [by_k[k] for k in ks if by_k.get(k) is not None]
        steps = [b - a for a, b in itertools.pairwise(values)]
        monotone = all(d >= 0 for d in steps) or all(d <= 0 for d in steps)
        (steady if monotone else swinging).append(f"{context} ({point})")
    return (
        f"The norm is not monotone in K (it swings rather than steadily exploding or vanishing) "
        f"in {len(swinging)} of {len(norms)} rows"
        + (f": {', '.join(swinging)}" if swinging else "")
        + (f"; monotone in {', '.join(steady)}." if steady else ".")
    )


def _f3(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}"


def _kappa(row: Mapping[str, Any]) -> Any:
    """κ(I − J), "∞" when σ_min is 0 (results.json stores the infinity as null)."""
    if row.get("kappa") is None and row.get("sigma_min") == 0:
        return "∞"
    return row.get("kappa")


def _ratio(by_k: Mapping[int, float | None], ks: Sequence[int]) -> float | None:
    """Spread of the gradient norm over K: largest over smallest (of those > 0)."""
    present = [by_k[k] for k in ks if by_k.get(k)]
    if len(present) < 2:
        return None
    return max(present) / min(present)  # type: ignore[type-var, operator]


def _seeds(rows: Sequence[Any]) -> str:
    counts = {len(row.jobs) for row in rows}
    return " / ".join(map(str, sorted(counts))) or "0"


def _modes(results: Mapping[str, Any]) -> list[str]:
    return list(dict.fromkeys(r["adjoint"] for r in results["grad_vs_k"]))
