"""The generation v3 page: the pilot gate, the paired comparison of every arm, the reference rows.

    python -m experiments.studies.generation_v3.report [--results R] [--pairing-results P]
        [--out docs/generation_v3.md]

Every number comes from the results rows (``run``) or is computed from the data (the two
reference predictors); the page renders with no rows (it says that nothing has run) and with a
partial set (it says which jobs are missing). A verdict is a paired 95 % t interval over the seeds
both arms have (``experiments.reports.verdicts.paired_interval``); the held-out loss is lower
for the better arm, so intervals are of ``loss(b) - loss(a)``: above 0 when ``a`` is better.
The sample metrics (``samples``) are read from the rows that have them (older rows: "not
measured"), as mean ± sd per arm and paired intervals oriented so that above 0 means ``a`` is
better. The pairing check's rows (``--pairing-results``) give each arm's held-out balanced
accuracy and its paired interval against no context, ``accuracy(a) - accuracy(none)``: above
0 when ``a`` carries the pairing better.
"""

from __future__ import annotations

import argparse
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from experiments.data.far_twins import FarTwinsDataset, right_cell
from experiments.engine.file_sinks import read_jsonl
from experiments.reports.render import Table, fixed, render_beside
from experiments.reports.verdicts import paired_interval
from experiments.studies.generation_v3.checks import failure_note, plateau_check, rerun_check
from experiments.studies.generation_v3.figures import curve_figure, job_minutes, projected_minutes
from experiments.studies.generation_v3.plan import ARMS, PILOT_ARMS, Plan

DEFAULT_RESULTS = Path("docs/generation_v3/results.jsonl")
DEFAULT_PAIRING = Path("docs/generation_v3/pairing.jsonl")
DEFAULT_OUT = Path("docs/generation_v3.md")
COMMAND = "make generate"


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The results file's rows (none when it does not exist); a later row of one job replaces
    an earlier one."""
    rows = read_jsonl(path) if path.exists() else []
    return list({row["job"]: row for row in rows}.values())


def plateau_change(losses: Sequence[float], share: float) -> float | None:
    """Relative change ``|L_end - L_start| / L_start`` of the loss over the last ``share`` of
    the curve (start: the point ``ceil(share * n)`` points before the end); None when the curve
    has fewer than 2 points."""
    n = len(losses)
    if n < 2:
        return None
    back = max(1, round(share * n))
    start = losses[max(0, n - 1 - back)]
    return abs(losses[-1] - start) / abs(start)


@dataclass(frozen=True)
class Interval:
    """A paired difference of arms ``a`` and ``b`` over ``n`` seeds, oriented so that above 0
    means ``a`` is better: ``loss(b) - loss(a)`` of held-out losses, ``accuracy(a) -
    accuracy(b)`` of accuracies."""

    n: int
    mean: float
    low: float
    high: float

    @property
    def text(self) -> str:
        """``mean [low, high]``."""
        return f"{self.mean:+.3f} [{self.low:+.3f}, {self.high:+.3f}]"

    @property
    def verdict(self) -> str:
        """``a`` "better" / "worse" than ``b``, or "no detectable difference"."""
        if self.low > 0:
            return "better"
        if self.high < 0:
            return "worse"
        return "no detectable difference"


def _values(
    rows: Sequence[Mapping[str, Any]], arm: str, digest: str, key: str = "val_loss"
) -> dict[int, float]:
    """{seed: row[key]} of ``arm``'s rows of the plan ``digest``."""
    return {int(r["seed"]): float(r[key]) for r in rows
            if r["arm"] == arm and r["plan"] == digest}  # fmt: skip


def _paired(
    va: Mapping[int, float], vb: Mapping[int, float], seeds: Sequence[int]
) -> Interval | None:
    """Paired interval of ``va - vb`` over the ``seeds`` both have (None: fewer than 2)."""
    both = [s for s in seeds if s in va and s in vb]
    if len(both) < 2:
        return None
    i = paired_interval([va[s] - vb[s] for s in both])
    return Interval(i.n, i.mean, i.lower, i.upper)


def improvement(
    rows: Sequence[Mapping[str, Any]], a: str, b: str, plan: Plan, seeds: Sequence[int]
) -> Interval | None:
    """Paired interval of ``loss(b) - loss(a)`` over the ``seeds`` both arms have (None: < 2)."""
    digest = plan.digest()
    return _paired(_values(rows, b, digest), _values(rows, a, digest), seeds)


@dataclass(frozen=True)
class GateResult:
    """The pilot gate: self-attention's held-out loss below no context's, paired interval above
    0 over all ``pilot_seeds``."""

    interval: Interval | None
    seeds: int

    @property
    def passed(self) -> bool:
        """Whether every pilot seed ran and the interval lies above 0."""
        i = self.interval
        return i is not None and i.n >= self.seeds and i.low > 0

    @property
    def summary(self) -> str:
        """One line: the interval and the outcome."""
        i = self.interval
        if i is None:
            return f"not run yet (0 or 1 of {self.seeds} paired seeds)"
        outcome = "passed" if self.passed else ("incomplete" if i.n < self.seeds else "failed")
        return (
            f"loss(none) - loss(self_attention) = {i.mean:+.3f}, 95 % interval "
            f"[{i.low:+.3f}, {i.high:+.3f}] over {i.n} of {self.seeds} seeds: {outcome}"
        )


def gate(rows: Sequence[Mapping[str, Any]], plan: Plan) -> GateResult:
    """The pilot gate read from the rows."""
    return GateResult(improvement(rows, *PILOT_ARMS[::-1], plan, plan.pilot_seeds),
                      len(plan.pilot_seeds))  # fmt: skip


def references(plan: Plan, seed: int = 0) -> dict[str, float]:
    """Held-out loss of two predictors computed from the data (the preset's sizes, ``seed``):
    the mean right digit of the train canvases (what a model without context can reach) and the
    mean right digit of the left digit's class (what knowing the class is worth)."""
    del plan
    train, val = FarTwinsDataset("train", 4096, seed=seed), FarTwinsDataset("val", 1024, seed=seed)
    rt, rv = right_cell(train.canvases), right_cell(val.canvases)
    means = torch.stack([rt[train.labels == c].mean(0) for c in range(10)])
    return {
        "unconditional": float((rv - rt.mean(0)).pow(2).sum((1, 2)).mean()),
        "class": float((rv - means[val.labels]).pow(2).sum((1, 2)).mean()),
    }


def _mean(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if values else None


def arm_table(rows: Sequence[Mapping[str, Any]], plan: Plan) -> Table:
    """Per arm: seeds done, mean held-out loss, seeds at a plateau, gamma, time per step, peak
    memory, failures of the implicit layers counted by the engine's policy (mean per job)."""
    body = []
    for arm in plan.arms:
        mine = [r for r in rows if r["arm"] == arm and r["plan"] == plan.digest()]
        body.append((
            ARMS[arm][1],
            f"{len(mine)} / {len(plan.seeds)}",
            fixed(_mean([r["val_loss"] for r in mine])),
            f"{sum(bool(r['at_plateau']) for r in mine)} / {len(mine)}",
            fixed(_mean([r["gamma"] for r in mine])),
            fixed(_mean([1000 * r["time_per_step_s"] for r in mine]), 1),
            fixed(_mean([r["peak_memory_mb"] for r in mine]), 0),
            fixed(_mean([r.get("failures") or 0 for r in mine]), 0),
        ))  # fmt: skip
    header = ("arm", "seeds done", "held-out loss (mean)", "at a plateau", "final γ (mean)",
              "ms / step", "peak memory, MiB", "failures / job")  # fmt: skip
    return Table.of(header, body)


def _against_pilots(plan: Plan) -> list[tuple[str, str]]:
    """(arm, base): every arm against no context and against self-attention, but no context
    against self-attention (the gate's question, asked the other way round)."""
    return [(arm, base) for arm in plan.arms for base in PILOT_ARMS
            if arm != base and (arm, base) != ("none", "self_attention")]  # fmt: skip


def comparison_table(rows: Sequence[Mapping[str, Any]], plan: Plan) -> Table:
    """Every arm against no context and against self-attention, paired over the main seeds."""
    body = []
    for arm, base in _against_pilots(plan):
        i = improvement(rows, arm, base, plan, plan.seeds)
        body.append((ARMS[arm][1], ARMS[base][1]) + (
            ("–", "–", "not enough paired seeds") if i is None else
            (str(i.n), i.text, i.verdict)
        ))  # fmt: skip
    header = ("arm a", "against b", "seeds", "loss(b) - loss(a), 95 % interval", "a is")
    return Table.of(header, body)


# the gradient question: each Hamburger gradient against BPTT through the same NMF block
GRADIENT_PAIRS = (("nmf_one_step", "nmf_unroll"), ("nmf_implicit", "nmf_unroll"))


Verdicts = dict[tuple[str, str], Interval | None]


def verdicts(rows: Sequence[Mapping[str, Any]], plan: Plan) -> Verdicts:
    """The page's questions and their paired intervals of the held-out loss: each Hamburger arm
    against self-attention (the paper's claim), then each gradient against BPTT (does the
    gradient matter); None where fewer than two seeds are paired."""
    pairs = [(arm, "self_attention") for arm in plan.arms if arm not in PILOT_ARMS]
    pairs += [p for p in GRADIENT_PAIRS if set(p) <= set(plan.arms)]
    return {(a, b): improvement(rows, a, b, plan, plan.seeds) for a, b in pairs}


def answers(rows: Sequence[Mapping[str, Any]], plan: Plan) -> list[str]:
    """``verdicts`` as one sentence per question."""
    out = []
    for (a, b), i in verdicts(rows, plan).items():
        said = ("not enough paired seeds yet" if i is None else
                f"{i.verdict} (held-out loss of the second minus the first: {i.text}, "
                f"{i.n} seeds)")  # fmt: skip
        out.append(f"{ARMS[a][1]} against {ARMS[b][1]}: {said}.")
    return out


def pairing_table(rows: Sequence[Mapping[str, Any]], plan: Plan) -> Table:
    """Per arm: the pairing classifier's held-out balanced accuracy (mean ± sd over its seeds,
    and each seed's), the seeds at a plateau (val loss), its final gamma and time per step."""
    body = []
    for arm in plan.arms:
        mine = [r for r in rows if r["arm"] == arm and r["plan"] == plan.pairing_digest()]
        by_seed = _values(rows, arm, plan.pairing_digest(), "balanced_accuracy")
        values = [by_seed[s] for s in sorted(by_seed)]
        body.append((
            ARMS[arm][1],
            f"{len(values)} / {len(plan.pairing_seeds)}",
            _spread(values, 3, "–"),
            ", ".join(f"{by_seed[s]:.3f}" for s in sorted(by_seed)) or "–",
            f"{sum(bool(r.get('at_plateau')) for r in mine)} / {len(mine)}",
            fixed(_mean([r["gamma"] for r in mine])),
            fixed(_mean([1000 * r["time_per_step_s"] for r in mine]), 1),
        ))  # fmt: skip
    header = ("arm", "seeds done", "balanced accuracy (mean ± sd)", "by seed (0, 1, ...)",
              "at a plateau", "final γ (mean)", "ms / step")  # fmt: skip
    return Table.of(header, body)


def pairing_comparison(rows: Sequence[Mapping[str, Any]], plan: Plan) -> Table:
    """Every context arm's balanced accuracy against no context's, paired by seed."""
    digest, body = plan.pairing_digest(), []
    base = _values(rows, "none", digest, "balanced_accuracy")
    for arm in plan.arms:
        if arm == "none":
            continue
        mine = _values(rows, arm, digest, "balanced_accuracy")
        i = _paired(mine, base, plan.pairing_seeds)
        body.append((ARMS[arm][1],) + (("–", "–", "not enough paired seeds") if i is None
                                       else (str(i.n), i.text, i.verdict)))  # fmt: skip
    header = ("arm a", "seeds", "accuracy(a) - accuracy(no context), 95 % interval", "a is")
    return Table.of(header, body)


# sample metric -> (column label, higher is better)
SAMPLE_METRICS: dict[str, tuple[str, bool]] = {
    "consistency": ("pair consistency", True),
    "kappa": ("kappa", True),
    "fid": ("FID", False),
    "kid": ("KID", False),
    "precision": ("precision", True),
    "recall": ("recall", True),
}


def _sample_values(
    rows: Sequence[Mapping[str, Any]],
    arm: str | None,
    digest: str,
    metric: str,
    key: str = "samples",
) -> dict[int, float]:
    """{seed: row[key][metric]} of ``arm``'s rows (any arm's when None) of the plan ``digest``
    that have sample metrics (older rows have none: not measured)."""
    return {int(r["seed"]): float(r[key][metric]) for r in rows
            if (arm is None or r["arm"] == arm) and r["plan"] == digest
            and isinstance(r.get(key), Mapping)}  # fmt: skip


def _spread(values: Sequence[float], digits: int, empty: str = "not measured") -> str:
    if not values:
        return empty
    sd = f" ± {statistics.stdev(values):.{digits}f}" if len(values) > 1 else ""
    return f"{statistics.fmean(values):.{digits}f}{sd}"


def _metric_digits(metric: str) -> int:
    return 2 if metric == "fid" else 3


def samples_table(rows: Sequence[Mapping[str, Any]], plan: Plan) -> Table:
    """Per arm: the seeds with sample metrics and each metric's mean ± sd over them; last, the
    real-data row (the true masked cells scored the same way, one value per seed)."""
    digest, body = plan.digest(), []
    for arm in plan.arms:
        seeds = _sample_values(rows, arm, digest, "kappa")
        cells = [_spread(list(_sample_values(rows, arm, digest, m).values()), _metric_digits(m))
                 for m in SAMPLE_METRICS]  # fmt: skip
        body.append((ARMS[arm][1], f"{len(seeds)} / {len(plan.seeds)}", *cells))
    real = [_spread(list(_sample_values(rows, None, digest, m, "samples_real").values()),
                    _metric_digits(m)) for m in SAMPLE_METRICS]  # fmt: skip
    real_seeds = _sample_values(rows, None, digest, "kappa", "samples_real")
    body.append(("real held-out cells (reference)", f"{len(real_seeds)} / {len(plan.seeds)}",
                 *real))  # fmt: skip
    header = ("arm", "seeds measured", *(label for label, _ in SAMPLE_METRICS.values()))
    return Table.of(header, body)


def classifier_accuracies(rows: Sequence[Mapping[str, Any]], plan: Plan) -> dict[int, float]:
    """{data seed: the digit classifier's accuracy on that seed's val scans} from the rows."""
    return {int(r["seed"]): float(r["classifier"]["val_accuracy"]) for r in rows
            if r["plan"] == plan.digest() and isinstance(r.get("classifier"), Mapping)}  # fmt: skip


def samples_comparison(rows: Sequence[Mapping[str, Any]], plan: Plan) -> Table:
    """Every arm against no context and against self-attention, each sample metric's paired 95 %
    interval over the seeds both have, oriented so that above 0 means ``a`` is better
    (``a - b`` of the higher-is-better metrics, ``b - a`` of FID and KID)."""
    digest, body = plan.digest(), []
    for arm, base in _against_pilots(plan):
        cells, counts = [], set()
        for metric, (_, higher) in SAMPLE_METRICS.items():
            va = _sample_values(rows, arm, digest, metric)
            vb = _sample_values(rows, base, digest, metric)
            i = _paired(va, vb, plan.seeds) if higher else _paired(vb, va, plan.seeds)
            cells.append("–" if i is None else i.text)
            counts.add(0 if i is None else i.n)
        body.append((ARMS[arm][1], ARMS[base][1], str(max(counts)), *cells))
    header = ("arm a", "against b", "seeds",
              *(label for label, _ in SAMPLE_METRICS.values()))  # fmt: skip
    return Table.of(header, body)


def provenance_summary(rows: Sequence[Mapping[str, Any]]) -> str:
    """Where the rows ran, for the page: the count of rows per library commit and processor
    (``run._train`` records them), and of rows written before rows recorded it."""
    counts = Counter(f"commit {row['commit']} on {row['cpu']}" if "commit" in row
                     else "not recorded" for row in rows)  # fmt: skip
    return "; ".join(f"{key}: {n} row(s)" for key, n in sorted(counts.items())) or "no rows"


def write_page(
    results: Path, out: Path, plan: Plan | None = None, pairing: Path = DEFAULT_PAIRING
) -> Path:
    """Render the page from ``results`` and the pairing check's ``pairing`` rows into ``out``;
    returns ``out``."""
    plan = plan or Plan()
    rows = read_rows(results)
    pairing_rows = [r for r in read_rows(pairing) if r["plan"] == plan.pairing_digest()]
    mine = [r for r in rows if r["plan"] == plan.digest()]
    figures = out.with_suffix("")  # docs/generation_v3.md -> docs/generation_v3/
    curve_figure(mine, plan.arms, "held-out loss", figures / "loss_curves.png")
    curve_figure(pairing_rows, plan.arms, "held-out balanced accuracy",
                 figures / "pairing_curves.png")  # fmt: skip
    expected = {job.key for job in plan.main_jobs()}
    done = {r["job"] for r in rows if r["plan"] == plan.digest()}
    text = render_beside(
        __file__,
        "page.md.j2",
        command=COMMAND,
        results=results.as_posix(),
        plan=plan,
        gate=gate(rows, plan),
        refs=references(plan),
        arms=arm_table(rows, plan),
        comparison=comparison_table(rows, plan),
        answers=answers(rows, plan),
        plateau=plateau_check(rows, plan, verdicts),
        failure_note=failure_note(rows, plan, plan.digest(), "main stage"),
        pairing_failure_note=failure_note(
            pairing_rows, plan, plan.pairing_digest(), "pairing check"
        ),
        done=len(done & expected),
        expected=len(expected),
        missing=sorted(expected - done),
        pairing_results=pairing.as_posix(),
        pairing_done=len(pairing_rows),
        pairing_expected=len(plan.pairing_jobs()),
        pairing=pairing_table(pairing_rows, plan),
        pairing_comparison=pairing_comparison(pairing_rows, plan),
        samples=samples_table(rows, plan),
        samples_comparison=samples_comparison(rows, plan),
        measured=sum(
            isinstance(r.get("samples"), Mapping) for r in rows if r["plan"] == plan.digest()
        ),
        accuracies=classifier_accuracies(rows, plan),
        provenance=provenance_summary(mine),
        reruns=rerun_check(results, plan.digest()),
        pairing_provenance=provenance_summary(pairing_rows),
        figures=figures.name,
        main_minutes=job_minutes(mine),
        samples_minutes=sum(float(r.get("samples_time_s", 0.0)) for r in mine) / 60,
        pairing_minutes=job_minutes(pairing_rows),
        main_projected=projected_minutes(mine, len(plan.seeds)),
        pairing_projected=projected_minutes(pairing_rows, len(plan.pairing_seeds)),
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return out


def main(argv: Sequence[str] | None = None) -> None:
    """Command line (module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=DEFAULT_RESULTS)
    parser.add_argument("--pairing-results", type=Path, default=DEFAULT_PAIRING)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    print(write_page(args.results, args.out, pairing=args.pairing_results))


if __name__ == "__main__":
    main()
