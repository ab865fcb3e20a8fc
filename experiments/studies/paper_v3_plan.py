"""The jobs of the paper-regime study v3 and the automatic learning-rate selection.

The study (``experiments.studies.paper_v3`` runs it, ``experiments.reports.study_paper_v3``
reports it) has four stages, every job a (context, gradient, K, inv_t, lr, replicate, epochs):

1. ``pretrain``: one backbone per replicate, on that replicate's clean train scans.
2. ``tune``: on the ``tune_replicates``, every learning rate of ``lrs`` for each context and
   gradient at K = ``main_k`` (and each inv_t of ``inv_ts`` for VQ and CD), ``short_epochs``.
3. ``main``: every arm on every replicate at its selected learning rate, ``main_epochs``.
4. ``k_axis``: one-step and BPTT per ham at each K of ``ks`` on the ``k_replicates``, at the
   selected learning rate and the ham's selected inv_t, ``short_epochs`` (K = ``main_k`` on a
   tuning replicate is then the tuning job itself: one job, one row).

Selection reads validation mIoU only (``select_lr``, ``select_inv_t``); the jobs of stages 3 and
4 follow from the tuning rows, so a study resumed from its CSV rebuilds the same jobs. Each
replicate has its own data seed (``data_seed``: the scan split and the canvases), model seed
and pretraining run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

HAMS = ("nmf", "vq", "cd")
BASELINES = ("none", "sdpa")
ONE_STEP, THROUGH_BASES, BPTT, NO_GRADIENT = "one_step", "one_step_bases", "bptt", "-"
HAM_GRADIENTS = (ONE_STEP, THROUGH_BASES, BPTT)
TUNED_GRADIENTS = (ONE_STEP, BPTT)  # the through-bases one-step uses the one-step's lr
REGIME = "finetune"
STUDY = "paper_v3"
# conf/arm option of each (context, gradient)
ARM_NAMES = {
    ("none", NO_GRADIENT): "none",
    ("sdpa", NO_GRADIENT): "sdpa_matched32",
    **{(ham, ONE_STEP): f"{ham}_one_step" for ham in HAMS},
    **{(ham, THROUGH_BASES): f"{ham}_one_step_bases" for ham in HAMS},
    **{(ham, BPTT): f"{ham}_unroll" for ham in HAMS},
}
# inv_t values with a name: what the official HamNet settings use, and the class default
INV_T_NAMES = {1.0: "official HamNet setting (INV_T = 1)", 100.0: "class / library default"}


@dataclass(frozen=True)
class Plan:
    """Everything the study's jobs depend on (its digest is stored in every CSV row).

    Attributes:
        replicates: how many independent replicates (data seed ``data_seed_base + r``, model
            seed ``r``, pretraining seed ``r``).
        tune_replicates, k_replicates: the replicates of the tuning grid and of the K axis.
        lrs: the learning-rate grid; inv_ts: VQ / CD's softmax inverse temperatures.
        main_k: K of tuning and of the main arms; ks: the K axis.
        main_epochs, short_epochs: epochs of the main arms and of the tuning grid / K axis.
        pretrain_steps, pretrain_images: the backbone's pretraining (``PretrainConf``).
        overrides: extra Hydra overrides of every training job (the tests' tiny sizes).
    """

    replicates: int = 5
    tune_replicates: tuple[int, ...] = (0, 1)
    k_replicates: tuple[int, ...] = (0, 1)
    lrs: tuple[float, ...] = (0.025, 0.05, 0.1, 0.2)
    inv_ts: tuple[float, ...] = (1.0, 10.0, 100.0)
    main_k: int = 6
    ks: tuple[int, ...] = (1, 3, 6, 12)
    main_epochs: int = 8
    short_epochs: int = 4
    pretrain_steps: int = 400
    pretrain_images: int = 1024
    data_seed_base: int = 1000
    overrides: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        outside = [r for r in (*self.tune_replicates, *self.k_replicates)
                   if not 0 <= r < self.replicates]  # fmt: skip
        if outside or self.replicates < 1:
            raise ValueError(
                f"Plan: replicates {outside} outside range({self.replicates}); tune_replicates "
                "and k_replicates must be replicates of the study"
            )
        if self.main_k not in self.ks:
            raise ValueError(f"Plan: main_k={self.main_k} must be one of ks={self.ks}")
        if not self.lrs or not self.inv_ts:
            raise ValueError("Plan: lrs and inv_ts must not be empty")

    def digest(self) -> str:
        """A short hash of the plan (rows of another plan are not mixed in)."""
        text = json.dumps(dataclasses.asdict(self), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:10]

    def data_seed(self, replicate: int) -> int:
        """The replicate's data seed: its scan split and its canvases."""
        return self.data_seed_base + replicate

    def inv_ts_of(self, context: str) -> tuple[float | None, ...]:
        """The inv_t axis of a context: VQ and CD vary it, the others have none (None)."""
        return tuple(self.inv_ts) if context in ("vq", "cd") else (None,)


@dataclass(frozen=True)
class Job:
    """One training job (or, with ``stage == "pretrain"``, one pretraining run)."""

    stage: str
    context: str
    gradient: str
    K: int
    inv_t: float | None
    lr: float | None
    replicate: int
    epochs: int

    @property
    def key(self) -> str:
        """The job's identity (its CSV row and its folder); the stage is not part of it."""
        if self.stage == "pretrain":
            return f"pretrain-r{self.replicate}"
        inv_t = "-" if self.inv_t is None else f"{self.inv_t:g}"
        return (
            f"{self.context}-{self.gradient}-K{self.K}-t{inv_t}-lr{self.lr:g}"
            f"-r{self.replicate}-e{self.epochs}"
        )

    @property
    def arm(self) -> str:
        """The conf/arm option of the job."""
        return ARM_NAMES[(self.context, self.gradient)]


def pretrain_jobs(plan: Plan) -> list[Job]:
    """One pretraining run per replicate."""
    return [Job("pretrain", "-", NO_GRADIENT, 0, None, None, r, 0) for r in range(plan.replicates)]


def _arms() -> list[tuple[str, str]]:
    """(context, gradient) of every tuned arm: the baselines, then one-step and BPTT per ham."""
    return [(b, NO_GRADIENT) for b in BASELINES] + [(h, g) for h in HAMS for g in TUNED_GRADIENTS]


def tune_jobs(plan: Plan) -> list[Job]:
    """The learning-rate grid on the tuning replicates."""
    return [
        Job("tune", context, gradient, plan.main_k, inv_t, lr, r, plan.short_epochs)
        for context, gradient in _arms()
        for inv_t in plan.inv_ts_of(context)
        for lr in plan.lrs
        for r in plan.tune_replicates
    ]


Rows = Mapping[str, Mapping[str, Any]]  # job key -> CSV row


def val_score(row: Mapping[str, Any] | None) -> float:
    """A row's final validation mIoU; -inf for a failed or non-finite job (never selected)."""
    if row is None or row.get("status") != "ok":
        return -math.inf
    value = float(row.get("val_miou", math.nan))
    return value if math.isfinite(value) else -math.inf


def select_lr(plan: Plan, rows: Rows, context: str, gradient: str, inv_t: float | None) -> float:
    """The learning rate of ``lrs`` with the highest mean final val mIoU over the tuning
    replicates (ties: the smaller rate); the through-bases one-step takes the one-step's.

    Raises:
        KeyError: a tuning job of this arm has no row yet.
    """
    tuned = ONE_STEP if gradient == THROUGH_BASES else gradient
    best, best_score = plan.lrs[0], -math.inf
    for lr in sorted(plan.lrs):
        scores = []
        for r in plan.tune_replicates:
            key = Job("tune", context, tuned, plan.main_k, inv_t, lr, r, plan.short_epochs).key
            scores.append(val_score(rows[key]))
        score = sum(scores) / len(scores)
        if score > best_score:
            best, best_score = lr, score
    return best


def tuned_score(plan: Plan, rows: Rows, context: str, gradient: str, inv_t: float | None) -> float:
    """Mean val mIoU over the tuning replicates at the selected learning rate."""
    lr = select_lr(plan, rows, context, gradient, inv_t)
    keys = [Job("tune", context, gradient, plan.main_k, inv_t, lr, r, plan.short_epochs).key
            for r in plan.tune_replicates]  # fmt: skip
    return sum(val_score(rows[k]) for k in keys) / len(keys)


def select_inv_t(plan: Plan, rows: Rows, ham: str) -> float | None:
    """The K axis's inv_t of a ham: the one whose tuned one-step and BPTT have the highest mean
    val mIoU (ties: the smaller inv_t); None for a ham without the axis."""
    best, best_score = None, -math.inf
    for inv_t in plan.inv_ts_of(ham):
        score = sum(tuned_score(plan, rows, ham, g, inv_t) for g in TUNED_GRADIENTS) / 2
        if best is None or score > best_score:
            best, best_score = inv_t, score
    return best


def main_jobs(plan: Plan, rows: Rows) -> list[Job]:
    """Every arm on every replicate at K = ``main_k`` and its selected learning rate."""
    arms = [(b, NO_GRADIENT) for b in BASELINES] + [(h, g) for h in HAMS for g in HAM_GRADIENTS]
    return [
        Job("main", c, g, plan.main_k, t, select_lr(plan, rows, c, g, t), r, plan.main_epochs)
        for r in range(plan.replicates)
        for c, g in arms
        for t in plan.inv_ts_of(c)
    ]


def k_axis_jobs(plan: Plan, rows: Rows) -> list[Job]:
    """One-step and BPTT per ham at every K, the selected lr and inv_t, short epochs."""
    jobs = []
    for ham in HAMS:
        inv_t = select_inv_t(plan, rows, ham)
        for g in TUNED_GRADIENTS:
            lr = select_lr(plan, rows, ham, g, inv_t)
            jobs += [Job("k_axis", ham, g, k, inv_t, lr, r, plan.short_epochs)
                     for r in plan.k_replicates for k in plan.ks]  # fmt: skip
    return jobs


def settled(rows: Rows, jobs: Iterable[Job]) -> bool:
    """Whether every job has a row (ok or failed)."""
    return all(job.key in rows for job in jobs)


def all_jobs(plan: Plan, rows: Rows) -> list[Job]:
    """The jobs known from ``rows``: pretraining and tuning always, the main arms and the K
    axis once every tuning job has a row. A job listed twice (a K-axis job that is a tuning
    job) appears once, under its first stage."""
    jobs = [*pretrain_jobs(plan), *tune_jobs(plan)]
    if settled(rows, tune_jobs(plan)):
        jobs += [*main_jobs(plan, rows), *k_axis_jobs(plan, rows)]
    seen: set[str] = set()
    unique = []
    for job in jobs:
        if job.key not in seen:
            seen.add(job.key)
            unique.append(job)
    return unique


def jobs_of_stage(plan: Plan, rows: Rows, stage: str) -> Sequence[Job]:
    """The jobs of one stage, duplicates included (the K axis's K = main_k tuning jobs)."""
    if stage == "pretrain":
        return pretrain_jobs(plan)
    if stage == "tune":
        return tune_jobs(plan)
    if stage == "main":
        return main_jobs(plan, rows)
    if stage == "k_axis":
        return k_axis_jobs(plan, rows)
    raise ValueError(f"unknown stage {stage!r}; stages: pretrain, tune, main, k_axis")
