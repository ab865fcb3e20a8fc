"""The paper-regime section of ``docs/results.md``: one-step vs BPTT on digit_seg, with power.

Reads the sweeps of ``experiments/scripts/study_paper.sh`` (``paper_finetune``, ``paper_frozen``,
``paper_adamw`` under the study folder). Every gradient arm is compared with BPTT *paired by
seed* (same initialisation, data order and forward value; only the gradient differs): the mean
difference and its 95 % t-interval. The verdict on the paper's claim "one-step >= BPTT" is
computed from the interval of the paper's one-step (bases detached) minus BPTT, in mIoU:

* **refuted**: the whole interval lies below 0 (one-step is worse, at 95 %);
* **holds**: the interval lies above -``MARGIN`` (one-step is at most one mIoU point worse,
  the size of the paper's own gaps, and possibly better);
* **undecided**: the interval reaches both below -``MARGIN`` and above 0.

``paper_regime`` computes the section's data (``PaperRegime``);
``templates/study/paper.md.j2`` writes it.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scipy import stats as scipy_stats

from experiments.data.digit_canvas import CANVAS, CELL, UPSAMPLE
from experiments.data.digits import NUM_CLASSES
from experiments.models.backbone import LocalBackbone
from experiments.reports.render import Table, setting
from experiments.reports.study_data import (
    PAPER_SWEEPS,
    PAPER_TASK,
    STRESS_TASK,
    StudyRuns,
    config_value,
    config_with,
    first_config,
    fmt,
    mean_std,
    row_config,
    select,
    target_name,
    train_steps,
    trained_from,
)
from experiments.reports.study_task_grad import TaskGradients, task_gradients
from experiments.reports.sweep import Job, Row, group_jobs, planned_jobs

REGIMES = {
    "paper_finetune": "fine-tuned backbone, SGD + poly LR",
    "paper_frozen": "frozen backbone, SGD + poly LR",
    "paper_adamw": "fine-tuned backbone, AdamW (constant LR)",
}
HAMS = ("nmf", "vq", "cd")
GRADIENTS = {  # arm suffix -> what the document calls it; {key}: the arm's config value
    "one_step": "one-step (paper: bases detached)",
    "one_step_bases": "one-step through the last step's bases",
    "unroll": "BPTT (unroll K = {context.steps})",
    "implicit_ridge": "Implicit(ridge = {adjoint.ridge:g})",
    "phantom": "Phantom(k = {adjoint.k}, τ = {adjoint.tau})",
}
CONTEXTS = {
    "none": "no context",
    "sdpa_matched32": "SDPA (parameter-matched)",
    "self_attention_matched32": "self-attention (parameter-matched)",
}
METRICS = ("val/miou", "val/blob_acc")
MARGIN = 0.01  # one mIoU point: the paper's gaps are 0.9 (NMF), 1.1 (VQ), 3.1 (CD) points
CONFIDENCE = 0.95  # of the paired t-intervals
CI = f"{100 * CONFIDENCE:g} %"
VERDICT_HEADER = (
    "regime", "ham", "paper gap (mIoU points)", f"one-step − BPTT [{CI} CI] (mIoU 0–1)", "claim",
    "paper gap in CI", "BPTT below no context"
)  # fmt: skip
PAPER_GAP = {"nmf": 0.009, "vq": 0.011, "cd": 0.031}  # one-step - BPTT, VOC val mIoU
# The paper's VOC set-up (Geng et al. 2021, official settings), quoted beside this regime's.
PAPER_SETUP = "ResNet-101, output stride 8, 60k SGD iterations with poly LR, batch 16"
STRIDE = 4  # the serial segmenter's backbone (LocalBackbone: strides 1, 2, 2, 1)


@dataclass(frozen=True)
class Paired:
    """The seed-paired difference ``a - b`` of a metric: mean, 95 % t-interval, pairs."""

    mean: float
    low: float
    high: float
    n: int

    def text(self, digits: int = 3) -> str:
        """``+0.012 [-0.004, +0.028] (n=5)``."""
        return (
            f"{self.mean:+.{digits}f} [{self.low:+.{digits}f}, {self.high:+.{digits}f}] "
            f"(n={self.n})"
        )

    def __str__(self) -> str:
        return self.text()


def paired_difference(a: Row | None, b: Row | None, metric: str) -> Paired | None:
    """Mean and ``CONFIDENCE`` t-interval of ``a - b`` over the seeds both rows finished (None
    with fewer than two pairs: no interval)."""
    if a is None or b is None:
        return None
    by_seed_a, by_seed_b = _by_seed(a, metric), _by_seed(b, metric)
    diffs = [by_seed_a[s] - by_seed_b[s] for s in sorted(by_seed_a.keys() & by_seed_b.keys())]
    if len(diffs) < 2:
        return None
    mean, sd = statistics.fmean(diffs), statistics.stdev(diffs)
    quantile = float(scipy_stats.t.ppf((1 + CONFIDENCE) / 2, len(diffs) - 1))
    half = quantile * sd / math.sqrt(len(diffs))
    return Paired(mean, mean - half, mean + half, len(diffs))


def verdict(diff: Paired | None) -> str:
    """"holds", "refuted" or "undecided" for one-step - BPTT (see the module docstring); "not
    run" without an interval."""
    if diff is None:
        return "not run"
    if diff.high < 0:
        return "refuted"
    if diff.low > -MARGIN:
        return "holds"
    return "undecided"


def _by_seed(row: Row, metric: str) -> dict[str, float]:
    out = {}
    for job in row.jobs:
        value = job.metrics.get(metric)
        if job.status == "ok" and isinstance(value, (int, float)) and math.isfinite(value):
            out[job.overrides.get("seed", "0")] = float(value)
    return out


@dataclass(frozen=True)
class Setup:
    """The regime's settings, from the ``paper_finetune`` jobs' configs (``data``, ``model``,
    ``optim``: those sections; ``ham``: a ham arm's ``context``), the canvas layout of
    ``experiments.data.digit_canvas``, the backbone's receptive field, the pretraining
    artefact's summary, and the seeds the sweep ran."""

    task: str
    stress_task: str
    data: Mapping[str, Any]
    model: Mapping[str, Any]
    optim: Mapping[str, Any]
    optimizer: str | None
    optimizer_name: str | None
    poly_power: Any
    batch_size: Any
    epochs: Any
    steps: int | None
    ham: Mapping[str, Any]
    seeds: tuple[str, ...]
    canvas: int
    cell: int
    scan: int
    upsample: int
    classes: int
    receptive_field: int
    stride: int
    pretrain: Mapping[str, Any] | None
    paper_setup: str


@dataclass(frozen=True)
class Regime:
    """One paper sweep: its name, its label, jobs done and planned."""

    sweep: str
    label: str
    ok: int
    planned: int


@dataclass(frozen=True)
class ContextGain:
    """Does context help here? The no-context model's digit-pixel accuracy and the table of
    attention's paired gains; ``helps``: every gain's interval lies above 0 (None without)."""

    none: tuple[float, float, int] | None
    table: Table
    gains: tuple[tuple[str, Paired], ...]
    helps: bool | None


@dataclass(frozen=True)
class HamVerdict:
    """The paper's claim for one ham in one regime (``sweep``, its label ``regime``): the
    paired difference one-step - BPTT, the verdict word (``verdict``), and whether BPTT's mean
    ended below the no-context model's (None without both)."""

    sweep: str
    regime: str
    ham: str
    diff: Paired
    says: str
    collapsed: bool | None

    @property
    def note(self) -> str:
        """The verdict with its collapse tag: ``holds (BPTT below no context)``."""
        return self.says + (" (BPTT below no context)" if self.collapsed else "")


@dataclass(frozen=True)
class PaperRegime:
    """Section 1's data. ``ran``: the ``paper_finetune`` sweep has jobs (the other fields but
    ``missing`` are empty without); ``arms``: (sweep, label, its table or None when the sweep
    did not run); ``subsets``: the sweeps that ran a proper subset of the fine-tuned sweep's
    arms; ``k``: the ham arms' ``context.steps``; ``missing``: unfinished jobs; ``margin``,
    ``paper_gaps`` (smallest, largest of ``PAPER_GAP``) and ``ci`` (the interval's level as
    text): the verdict's definitions."""

    task: str
    ran: bool
    setup: Setup | None
    regimes: tuple[Regime, ...]
    subsets: tuple[str, ...]
    context: ContextGain | None
    arms: tuple[tuple[str, str, Table | None], ...]
    verdict_table: Table
    verdicts: tuple[HamVerdict, ...]
    k: Any
    task_grad: TaskGradients | None
    missing: tuple[str, ...]
    margin: float
    paper_gaps: tuple[float, float]
    ci: str

    @property
    def headline(self) -> tuple[HamVerdict, ...]:
        """The fine-tuned regime's verdicts (the document's headline)."""
        return tuple(v for v in self.verdicts if v.sweep == "paper_finetune")

    @property
    def others(self) -> tuple[tuple[str, tuple[HamVerdict, ...]], ...]:
        """The other regimes' verdicts, by regime label (those with any)."""
        labels = dict.fromkeys(v.regime for v in self.verdicts if v.sweep != "paper_finetune")
        return tuple(
            (label, tuple(v for v in self.verdicts if v.regime == label)) for label in labels
        )

    @property
    def claims(self) -> tuple[tuple[str, tuple[str, ...]], ...]:
        """The headline's verdicts grouped: (verdict with tag, the hams that have it)."""
        groups: dict[str, list[str]] = {}
        for v in self.headline:
            groups.setdefault(v.note, []).append(v.ham)
        return tuple((note, tuple(hams)) for note, hams in groups.items())


def paper_regime(runs: StudyRuns) -> PaperRegime:
    """Section 1 from the paper sweeps, the pretraining artefact and the ``grad_paper``
    studies."""
    jobs = {name: runs.sweeps.get(name, []) for name in PAPER_SWEEPS}
    rows = {name: group_jobs(sweep_jobs) for name, sweep_jobs in jobs.items()}
    missing = tuple(_missing(runs, jobs))
    gaps = (min(PAPER_GAP.values()), max(PAPER_GAP.values()))
    if not jobs["paper_finetune"]:
        return PaperRegime(PAPER_TASK, False, None, (), (), None, (), Table.of((), ()), (), None,
                           None, missing, MARGIN, gaps, CI)  # fmt: skip
    finetune = rows["paper_finetune"]
    ham_config = config_with([r for r in finetune if _ham_arm(r)], "context")
    regimes = tuple(
        Regime(name, REGIMES[name], sum(j.status == "ok" for j in jobs[name]),
               planned_jobs(runs.root / name) or len(jobs[name]))
        for name in PAPER_SWEEPS
        if jobs[name]
    )  # fmt: skip
    arms = {name: {r.overrides.get("arm") for r in rows[name]} for name in PAPER_SWEEPS}
    grad = runs.studies.get("grad_paper", {})
    trained = trained_from(runs, [res for name, res in grad.items() if name.startswith("trained")])
    regime = REGIMES.get(trained.sweep or "", "?")
    label = (f"{PAPER_TASK} (init and {trained.mode_name or '?'}-trained seed "
             f"{trained.seed or '?'}, {regime})")  # fmt: skip
    verdicts = tuple(_verdicts(rows))
    return PaperRegime(
        task=PAPER_TASK,
        ran=True,
        setup=_setup(runs, jobs["paper_finetune"], ham_config),
        regimes=regimes,
        subsets=tuple(
            name for name in PAPER_SWEEPS[1:] if jobs[name] and arms[name] < arms["paper_finetune"]
        ),
        context=_context_gain(finetune),
        arms=tuple((name, REGIMES[name], _arms_table(rows[name])) for name in PAPER_SWEEPS),
        verdict_table=Table.of(VERDICT_HEADER, (_verdict_row(v) for v in verdicts)),
        verdicts=verdicts,
        k=config_value(ham_config, "context.steps"),
        task_grad=task_gradients(
            {f"{c} ({p})": grad.get(f"{p}_{c}") for c in HAMS for p in ("init", "trained")}, label
        ),
        missing=missing,
        margin=MARGIN,
        paper_gaps=gaps,
        ci=CI,
    )


def _ham_arm(row: Row) -> bool:
    ham, _, gradient = row.overrides.get("arm", "").partition("_")
    return ham in HAMS and gradient in GRADIENTS


def _missing(runs: StudyRuns, jobs: Mapping[str, Sequence[Job]]) -> list[str]:
    """Jobs of the paper-regime sweeps that failed or did not finish (an empty sweep is listed
    by ``StudyRuns.missing``)."""
    out = []
    for name, sweep_jobs in jobs.items():
        if not sweep_jobs:
            continue
        ok = sum(job.status == "ok" for job in sweep_jobs)
        expected = max(planned_jobs(runs.root / name) or len(sweep_jobs), len(sweep_jobs))
        if ok < expected:
            bad = [job for job in sweep_jobs if job.status != "ok"]
            detail = f"; failed or unfinished: {_arms(bad)}" if bad else ""
            out.append(
                f"{expected - ok}/{expected} jobs of `{name}` "
                f"({expected - len(sweep_jobs)} not started{detail})"
            )
    return out


def _setup(runs: StudyRuns, jobs: Sequence[Job], ham: Mapping[str, Any]) -> Setup:
    config = first_config(jobs)
    return Setup(
        task=PAPER_TASK,
        stress_task=STRESS_TASK,
        data=config.get("data", {}),
        model=config.get("model", {}),
        optim=config.get("optim", {}),
        optimizer=config_value(config, "optim._target_"),
        optimizer_name=target_name(config, "optim"),
        poly_power=config.get("lr_poly_power"),
        batch_size=config.get("batch_size"),
        epochs=config.get("epochs"),
        steps=train_steps(config) if config.get("data") and config.get("batch_size") else None,
        ham=ham.get("context", {}),
        seeds=tuple(sorted({j.overrides.get("seed", "0") for j in jobs})),
        canvas=CANVAS,
        cell=CELL,
        scan=CELL // UPSAMPLE,
        upsample=UPSAMPLE,
        classes=NUM_CLASSES,
        receptive_field=LocalBackbone.receptive_field,
        stride=STRIDE,
        pretrain=_pretrain(runs.root / "pretrain" / "backbone.pt"),
        paper_setup=PAPER_SETUP,
    )


def _arm(rows: Sequence[Row], arm: str) -> Row | None:
    return select(rows, arm=arm)


def _context_gain(finetune: Sequence[Row]) -> ContextGain:
    none = _arm(finetune, "none")
    body, gains = [], []
    for arm in ("sdpa_matched32", "self_attention_matched32"):
        row = _arm(finetune, arm)
        diff = paired_difference(row, none, "val/blob_acc")
        body.append([CONTEXTS[arm], fmt(mean_std(row, "val/blob_acc")), diff])
        if diff is not None:
            gains.append((CONTEXTS[arm], diff))
    return ContextGain(
        none=mean_std(none, "val/blob_acc"),
        table=Table.of(["context", "val/blob_acc", f"gain over none [{CI} CI]"], body),
        gains=tuple(gains),
        helps=all(d.low > 0 for _, d in gains) if gains else None,
    )


def gradient_label(gradient: str, config: Mapping[str, Any]) -> str:
    """What the document calls a gradient arm (``GRADIENTS``), its ``{key}`` / ``{key:spec}``
    placeholders filled from the arm's config (``?`` where it records none)."""
    return re.sub(
        r"\{([\w.]+)(?::([^}]*))?\}",
        lambda m: setting(config_value(config, m[1]), m[2] or ""),
        GRADIENTS[gradient],
    )


def _arms_table(rows: Sequence[Row]) -> Table | None:
    if not rows:
        return None
    body = []
    names = [*CONTEXTS, *(f"{h}_{g}" for h in HAMS for g in GRADIENTS)]
    for arm in names:
        row = select(rows, arm=arm)
        if row is None:
            continue
        ham, _, grad = arm.partition("_")
        bptt = select(rows, arm=f"{ham}_unroll") if grad in GRADIENTS else None
        diff = paired_difference(row, bptt, "val/miou") if grad != "unroll" else None
        seconds = mean_std(row, "train_time_s")
        body.append([
            ham if grad in GRADIENTS else CONTEXTS.get(arm, arm),
            gradient_label(grad, row_config(row)) if grad in GRADIENTS else "–",
            *(fmt(mean_std(row, m)) for m in METRICS),
            diff,
            None if seconds is None else seconds[0],
        ])  # fmt: skip
    header = ["context", "gradient", *METRICS, f"mIoU − BPTT [{CI} CI]", "train s"]
    return Table.of(header, body)


def _collapsed(rows: Mapping[str, Sequence[Row]], sweep: str, ham: str) -> bool | None:
    """Whether BPTT's mean mIoU is below the no-context model's (its training collapsed:
    the context made the model worse); None without both."""
    bptt = mean_std(_arm(rows[sweep], f"{ham}_unroll"), "val/miou")
    none = mean_std(_arm(rows[sweep], "none"), "val/miou")
    if none is None:
        none = mean_std(_arm(rows["paper_finetune"], "none"), "val/miou")
    return None if bptt is None or none is None else bptt[0] < none[0]


def _verdicts(rows: Mapping[str, Sequence[Row]]) -> list[HamVerdict]:
    out = []
    for sweep in PAPER_SWEEPS:
        for ham in HAMS:
            diff = paired_difference(_arm(rows[sweep], f"{ham}_one_step"),
                                     _arm(rows[sweep], f"{ham}_unroll"), "val/miou")  # fmt: skip
            if diff is not None:
                out.append(HamVerdict(sweep, REGIMES[sweep], ham, diff, verdict(diff),
                                      _collapsed(rows, sweep, ham)))  # fmt: skip
    return out


def _verdict_row(v: HamVerdict) -> list[Any]:
    gap = PAPER_GAP[v.ham]
    return [v.regime, v.ham, f"{100 * gap:+.1f}", v.diff, v.says,
            v.diff.low <= gap <= v.diff.high,
            {True: "yes", False: "no", None: "–"}[v.collapsed]]  # fmt: skip


def _arms(jobs: Sequence[Job]) -> str:
    return ", ".join(
        sorted({f"{j.overrides.get('arm', '?')} seed {j.overrides.get('seed', '?')}" for j in jobs})
    )


def _pretrain(path: Path) -> Mapping[str, Any] | None:
    """The pretraining artefact's config and clean validation accuracy on digit pixels, read
    from ``path`` (None when it does not exist)."""
    if not path.exists():
        return None
    from experiments.engine.checkpoint import read_checkpoint

    artefact: Mapping[str, Any] = read_checkpoint(path)
    return {**artefact["config"], "val_digit_acc": artefact["val_digit_acc"]}
