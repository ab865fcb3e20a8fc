"""The jobs of the paper-regime study v3 and the automatic learning-rate selection.

The study (``experiments.studies.paper_v3`` runs it, ``experiments.studies.paper_v3.report``
reports it) has four stages, every job a (context, gradient, K, inv_t, lr, replicate, epochs):

1. ``pretrain``: one backbone per replicate, on that replicate's clean train scans.
2. ``tune``: on the ``tune_replicates``, every learning rate of ``lrs`` for each context and
   gradient at K = ``main_k`` (and each inv_t of ``inv_ts`` for VQ and CD), ``short_epochs``.
   An arm whose best rate is an end of its grid gets the next rate beyond that end (``lr_factor``
   times the largest, or the smallest divided by it), up to ``lr_extensions`` times
   (``arm_lrs``), so a selected rate is an end of the grid only when the extensions ran out.
3. ``main``: every arm on every replicate at its selected learning rate, ``main_epochs``.
4. ``k_axis``: one-step and BPTT per ham at each K of ``ks`` on the ``k_replicates``, at the
   selected learning rate and the ham's selected inv_t, ``short_epochs`` (K = ``main_k`` on a
   tuning replicate is then the tuning job itself: one job, one row).
5. ``length``: every main arm again on the ``length_replicates`` at ``length_factor`` times
   ``main_epochs`` (the same lr; the poly schedule stretched to the longer run): whether the
   main arms trained long enough (the report compares each pair's final val mIoU).

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
        lrs: the base learning-rate grid, extended per arm past an end that is best (at most
            ``lr_extensions`` rates beyond either end, each ``lr_factor`` times further).
        inv_ts: VQ / CD's softmax inverse temperatures.
        main_k: K of tuning and of the main arms; ks: the K axis.
        main_epochs, short_epochs: epochs of the main arms and of the tuning grid / K axis.
        length_replicates, length_factor: the training-length check's replicates and how many
            times ``main_epochs`` its runs train (one replicate by default: each doubles the
            main stage's cost on its replicate, and the 150-minute budget of ``make study``
            leaves room for one).
        pretrain_steps, pretrain_images: the backbone's pretraining (``PretrainConf``).
        overrides: extra Hydra overrides of every training job (the tests' tiny sizes).
    """

    replicates: int = 5
    tune_replicates: tuple[int, ...] = (0, 1)
    k_replicates: tuple[int, ...] = (0, 1)
    lrs: tuple[float, ...] = (0.025, 0.05, 0.1, 0.2)
    lr_extensions: int = 2
    lr_factor: float = 2.0
    inv_ts: tuple[float, ...] = (1.0, 10.0, 100.0)
    main_k: int = 6
    ks: tuple[int, ...] = (1, 3, 6, 12)
    main_epochs: int = 32
    short_epochs: int = 4
    length_replicates: tuple[int, ...] = (0,)
    length_factor: int = 2
    pretrain_steps: int = 400
    pretrain_images: int = 1024
    data_seed_base: int = 1000
    overrides: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        chosen = (*self.tune_replicates, *self.k_replicates, *self.length_replicates)
        outside = [r for r in chosen if not 0 <= r < self.replicates]
        if outside or self.replicates < 1:
            raise ValueError(
                f"Plan: replicates {outside} outside range({self.replicates}); tune_replicates, "
                "k_replicates and length_replicates must be replicates of the study"
            )
        if self.length_factor < 2:
            raise ValueError(
                f"Plan: length_factor={self.length_factor} must be >= 2 (the check trains the "
                "main arms that many times longer)"
            )
        if self.main_k not in self.ks:
            raise ValueError(f"Plan: main_k={self.main_k} must be one of ks={self.ks}")
        if not self.lrs or not self.inv_ts:
            raise ValueError("Plan: lrs and inv_ts must not be empty")
        if self.lr_extensions < 0 or self.lr_factor <= 1:
            raise ValueError(
                f"Plan: lr_extensions={self.lr_extensions} must be >= 0 and "
                f"lr_factor={self.lr_factor} > 1"
            )

    def digest(self) -> str:
        """A short hash of what a job's result depends on beyond its key (the pretraining, the
        data seeds, the extra overrides): rows of another digest are not mixed in. The grid's
        shape (replicates, rates, temperatures, K values, extensions) only decides which jobs
        exist; each job's key names its own lr, inv_t, K, replicate and epochs, so a row stays
        valid when the grid grows."""
        fields = ("pretrain_steps", "pretrain_images", "data_seed_base", "overrides")
        text = json.dumps({f: getattr(self, f) for f in fields}, sort_keys=True)
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


Rows = Mapping[str, Mapping[str, Any]]  # job key -> CSV row


def _tune_job(plan: Plan, context: str, gradient: str, inv_t: float | None, lr: float,
              replicate: int) -> Job:  # fmt: skip
    return Job("tune", context, gradient, plan.main_k, inv_t, lr, replicate, plan.short_epochs)


def val_score(row: Mapping[str, Any] | None) -> float:
    """A row's final validation mIoU; -inf for a failed or non-finite job (never selected)."""
    if row is None or row.get("status") != "ok":
        return -math.inf
    value = float(row.get("val_miou", math.nan))
    return value if math.isfinite(value) else -math.inf


def _mean_score(plan: Plan, rows: Rows, context: str, gradient: str, inv_t: float | None,
                lr: float) -> float:  # fmt: skip
    """Mean final val mIoU over the tuning replicates (KeyError: a job has no row yet)."""
    keys = [_tune_job(plan, context, gradient, inv_t, lr, r).key for r in plan.tune_replicates]
    return sum(val_score(rows[k]) for k in keys) / len(keys)


def _best(scores: Mapping[float, float]) -> float:
    """The rate with the highest score (ties: the smaller rate)."""
    best, best_score = min(scores), -math.inf
    for lr in sorted(scores):
        if scores[lr] > best_score:
            best, best_score = lr, scores[lr]
    return best


def arm_lrs(plan: Plan, rows: Rows, context: str, gradient: str,
            inv_t: float | None) -> tuple[float, ...]:  # fmt: skip
    """The learning rates tuned for an arm so far, ascending: ``lrs``, then, while every rate so
    far has its rows and the best is the largest (smallest), one rate ``lr_factor`` times
    larger (smaller), at most ``lr_extensions`` times. The through-bases one-step uses the
    one-step's grid."""
    tuned = ONE_STEP if gradient == THROUGH_BASES else gradient
    grid = sorted(plan.lrs)
    for _ in range(plan.lr_extensions):
        try:
            scores = {lr: _mean_score(plan, rows, context, tuned, inv_t, lr) for lr in grid}
        except KeyError:
            break
        best = _best(scores)
        if not math.isfinite(scores[best]):
            break
        if best == grid[-1] and len(grid) > 1 and _beyond(plan, grid, up=True):
            grid.append(float(f"{grid[-1] * plan.lr_factor:.12g}"))
        elif best == grid[0] and len(grid) > 1 and _beyond(plan, grid, up=False):
            grid.insert(0, float(f"{grid[0] / plan.lr_factor:.12g}"))
        else:
            break
    return tuple(grid)


def _beyond(plan: Plan, grid: Sequence[float], up: bool) -> bool:
    """Whether the grid has room for one more extension on that side."""
    base = sorted(plan.lrs)
    added = sum(lr > base[-1] for lr in grid) if up else sum(lr < base[0] for lr in grid)
    return added < plan.lr_extensions


def edge_selected(plan: Plan, rows: Rows, context: str, gradient: str,
                  inv_t: float | None) -> bool:  # fmt: skip
    """Whether the arm's selected rate is an end of its (extended) grid: a better rate may lie
    beyond it (the extensions ran out)."""
    grid = arm_lrs(plan, rows, context, gradient, inv_t)
    return len(grid) > 1 and select_lr(plan, rows, context, gradient, inv_t) in (grid[0], grid[-1])


def tune_jobs(plan: Plan, rows: Rows) -> list[Job]:
    """The learning-rate grid on the tuning replicates, each arm's grid as extended so far."""
    return [
        _tune_job(plan, context, gradient, inv_t, lr, r)
        for context, gradient in _arms()
        for inv_t in plan.inv_ts_of(context)
        for lr in arm_lrs(plan, rows, context, gradient, inv_t)
        for r in plan.tune_replicates
    ]


def select_lr(plan: Plan, rows: Rows, context: str, gradient: str, inv_t: float | None) -> float:
    """The learning rate of the arm's grid (``arm_lrs``) with the highest mean final val mIoU
    over the tuning replicates (ties: the smaller rate); the through-bases one-step takes the
    one-step's.

    Raises:
        KeyError: a tuning job of this arm has no row yet.
    """
    tuned = ONE_STEP if gradient == THROUGH_BASES else gradient
    grid = arm_lrs(plan, rows, context, tuned, inv_t)
    return _best({lr: _mean_score(plan, rows, context, tuned, inv_t, lr) for lr in grid})


def tuned_score(plan: Plan, rows: Rows, context: str, gradient: str, inv_t: float | None) -> float:
    """Mean val mIoU over the tuning replicates at the selected learning rate."""
    lr = select_lr(plan, rows, context, gradient, inv_t)
    return _mean_score(plan, rows, context, gradient, inv_t, lr)


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


def length_jobs(plan: Plan, rows: Rows) -> list[Job]:
    """The main arms on the ``length_replicates`` at ``length_factor * main_epochs``."""
    epochs = plan.length_factor * plan.main_epochs
    chosen = [job for job in main_jobs(plan, rows) if job.replicate in plan.length_replicates]
    return [dataclasses.replace(job, stage="length", epochs=epochs) for job in chosen]


def settled(rows: Rows, jobs: Iterable[Job]) -> bool:
    """Whether every job has a row (ok or failed)."""
    return all(job.key in rows for job in jobs)


def all_jobs(plan: Plan, rows: Rows) -> list[Job]:
    """The jobs known from ``rows``: pretraining and tuning always, the main arms, the K axis
    and the length check once every tuning job has a row. A job listed twice (a K-axis job
    that is a tuning job) appears once, under its first stage."""
    jobs = [*pretrain_jobs(plan), *tune_jobs(plan, rows)]
    if settled(rows, tune_jobs(plan, rows)):
        jobs += [*main_jobs(plan, rows), *k_axis_jobs(plan, rows), *length_jobs(plan, rows)]
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
        return tune_jobs(plan, rows)
    if stage == "main":
        return main_jobs(plan, rows)
    if stage == "k_axis":
        return k_axis_jobs(plan, rows)
    if stage == "length":
        return length_jobs(plan, rows)
    raise ValueError(f"unknown stage {stage!r}; stages: pretrain, tune, main, k_axis, length")
