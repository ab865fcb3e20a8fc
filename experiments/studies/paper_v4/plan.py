"""The jobs of study v4: the paper's one-step claim at the paper's own settings, fixed in
advance, with the power to decide it.

Every job is a ``paper_v4.jobs.Job`` (context, gradient, K, inv_t, lr, replicate, epochs; its
key names them all) run from the ``paper_v4`` preset. Stages, in the order the runner starts them:

1. ``pretrain``: one backbone per replicate (tuning and test replicates alike).
2. ``tune``: on the ``tune_replicates`` only (never test replicates), every rate of ``lrs`` for
   each ham's one-step and BPTT arms and for each baseline, at the full ``main_epochs``.
   ``select_lr`` gives each ham **one** rate for both gradients (the best mean val mIoU over
   both gradients and the tuning replicates), so the two arms compared differ only in the
   gradient, as in the paper.
3. ``main`` (primary): on every test replicate ``0 .. replicates - 1``, the no-context and GAP
   baselines and NMF / VQ / CD x {one-step, BPTT} at inv_t = ``primary_inv_t`` (1, the official
   HamNet setting) and K = ``main_k`` (6). The three one-step - BPTT comparisons
   (``PRIMARY``) are the study's only confirmatory tests (margin ``MARGIN``, Holm over 3).
4. ``length``: the primary ham arms again on the ``length_replicates`` at ``length_factor``
   times ``main_epochs``.
5. ``secondary``: on the ``secondary_replicates``, the through-bases one-step per ham, VQ / CD
   at each of ``secondary_inv_ts``, and one-step / BPTT per ham at each K of ``ks``; all at the
   ham's selected rate. Exploratory: reported with intervals, never as verdicts.

Every training job clips the gradients' joint norm to ``clip_grad_norm`` (both gradients alike)
and evaluates on ``test_size`` canvases with the ham's fixed evaluation bases
(``eval_init="fixed"`` of conf/context: no initial-bases noise in any metric).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from experiments.studies.paper_v4.jobs import BPTT, HAMS, NO_GRADIENT, ONE_STEP, THROUGH_BASES, Job

STUDY = "paper_v4"
BASELINES = ("none", "gap")
GRADIENTS = (ONE_STEP, BPTT)
MARGIN = 0.01  # δ in test mIoU
# The paper's one-step - BPTT advantage on PASCAL VOC val (mIoU, /work/shared/hamburger.md §6:
# VQ 77.7 vs 76.6, CD 78.1 vs 75.0, NMF 78.3 vs 77.4).
PAPER_EFFECT = {"nmf": 0.009, "vq": 0.011, "cd": 0.031}
ARMS = {
    ("none", NO_GRADIENT): "none",
    ("gap", NO_GRADIENT): "gap",
    **{(ham, g): f"{ham}_{'unroll' if g == BPTT else g}" for ham in HAMS
       for g in (ONE_STEP, THROUGH_BASES, BPTT)},
}  # fmt: skip
STAGES = ("pretrain", "tune", "main", "length", "secondary")
Rows = Mapping[str, Mapping[str, Any]]


@dataclass(frozen=True)
class Plan:
    """Everything study v4's jobs depend on (``digest`` is stored in every CSV row).

    Attributes:
        replicates: the test replicates ``0 .. replicates - 1`` of the primary comparisons.
        tune_replicates: the learning-rate replicates; must not be test replicates.
        lrs: the rate grid (one rate selected per ham for both gradients, one per baseline);
            it spans the rates study v3 selected at inv_t 1 (0.2 and 0.4, from short runs).
        main_k, primary_inv_t: the paper's K and inverse temperature.
        main_epochs: the training length of every tuning, main and secondary job.
        length_replicates, length_factor: the length check's replicates and its multiple.
        secondary_replicates, secondary_inv_ts, ks: the exploratory arms' replicates, VQ / CD's
            other temperatures and the K axis.
        clip_grad_norm: the gradient-norm clip of every training job (both gradients): about
            three times the joint gradient norm of these networks on a batch (1.6-2.0 at the
            start of fine-tuning for every arm, 1.4-2.2 after 32 epochs of VQ BPTT, measured
            once on replicate 0), so it only cuts the spikes of an unstable backward pass.
        test_size: test canvases per replicate.
        pretrain_steps, pretrain_images, data_seed_base: the backbone and the data seeds
            (replicate r: data seed ``data_seed_base + r``, model seed r).
        overrides: extra Hydra overrides of every training job (the tests' tiny sizes).
    """

    replicates: int = 20
    tune_replicates: tuple[int, ...] = (100, 101)
    lrs: tuple[float, ...] = (0.1, 0.2, 0.4)
    main_k: int = 6
    primary_inv_t: float = 1.0
    main_epochs: int = 32
    length_replicates: tuple[int, ...] = (0, 1, 2, 3)
    length_factor: int = 2
    secondary_replicates: tuple[int, ...] = (0, 1, 2)
    secondary_inv_ts: tuple[float, ...] = (10.0, 100.0)
    ks: tuple[int, ...] = (1, 12)
    clip_grad_norm: float = 5.0
    test_size: int = 1024
    pretrain_steps: int = 400
    pretrain_images: int = 1024
    data_seed_base: int = 4000
    overrides: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        tests = set(range(self.replicates))
        if self.replicates < 2:
            raise ValueError(f"Plan: replicates={self.replicates}; a paired interval needs >= 2")
        if not self.tune_replicates or tests & set(self.tune_replicates):
            raise ValueError(
                f"Plan: tune_replicates {self.tune_replicates} must be non-empty and disjoint "
                f"from the test replicates range({self.replicates})"
            )
        outside = set(self.length_replicates) | set(self.secondary_replicates)
        if outside - tests:
            raise ValueError(
                f"Plan: length / secondary replicates {sorted(outside - tests)} are not test "
                f"replicates range({self.replicates})"
            )
        if self.length_factor < 2 or not self.lrs or self.main_k in self.ks:
            raise ValueError(
                f"Plan: length_factor={self.length_factor} must be >= 2, lrs non-empty, and ks "
                f"{self.ks} must not repeat main_k={self.main_k} (the primary arms are that K)"
            )
        if not self.clip_grad_norm > 0:
            raise ValueError(f"Plan: clip_grad_norm={self.clip_grad_norm} must be > 0")

    def digest(self) -> str:
        """A short hash of what a job's result depends on beyond its key (clip, test set,
        pretraining, data seeds, overrides); rows of another digest are not mixed in."""
        fields = ("clip_grad_norm", "test_size", "pretrain_steps", "pretrain_images",
                  "data_seed_base", "overrides")  # fmt: skip
        text = json.dumps({f: getattr(self, f) for f in fields}, sort_keys=True)
        return hashlib.sha256(f"{STUDY}:{text}".encode()).hexdigest()[:10]

    def data_seed(self, replicate: int) -> int:
        """The replicate's data seed: its scan split and its canvases."""
        return self.data_seed_base + replicate

    def all_replicates(self) -> list[int]:
        """The tuning replicates, then the test replicates."""
        return [*self.tune_replicates, *range(self.replicates)]


def arm_name(job: Job) -> str:
    """The conf/arm option of a job."""
    return ARMS[(job.context, job.gradient)]


def _job(
    plan: Plan, stage: str, context: str, gradient: str, lr: float, replicate: int, *,
    k: int | None = None, inv_t: float | None = None, epochs: int | None = None,
) -> Job:  # fmt: skip
    ham = context in HAMS
    return Job(
        stage, context, gradient,
        (plan.main_k if k is None else k) if ham else 0,
        (plan.primary_inv_t if inv_t is None else inv_t) if context in ("vq", "cd") else None,
        lr, replicate, plan.main_epochs if epochs is None else epochs,
    )  # fmt: skip


def pretrain_jobs(plan: Plan) -> list[Job]:
    """One pretraining run per replicate (tuning replicates first)."""
    return [Job("pretrain", "-", NO_GRADIENT, 0, None, None, r, 0) for r in plan.all_replicates()]


def tuned_arms() -> list[tuple[str, str]]:
    """(context, gradient) of every tuned arm: the baselines, then one-step and BPTT per ham."""
    return [(b, NO_GRADIENT) for b in BASELINES] + [(h, g) for h in HAMS for g in GRADIENTS]


def tune_jobs(plan: Plan) -> list[Job]:
    """Every rate of ``lrs`` for every tuned arm on every tuning replicate, full length."""
    return [
        _job(plan, "tune", context, gradient, lr, r)
        for context, gradient in tuned_arms()
        for lr in plan.lrs
        for r in plan.tune_replicates
    ]


def val_score(row: Mapping[str, Any] | None) -> float:
    """A row's final validation mIoU; -inf for a failed or non-finite job (never selected)."""
    if row is None or row.get("status") != "ok":
        return -math.inf
    value = float(row.get("val_miou", math.nan))
    return value if math.isfinite(value) else -math.inf


def lr_scores(plan: Plan, rows: Rows, context: str) -> dict[float, float]:
    """Per rate: mean final val mIoU over the tuning replicates and (a ham) both gradients; a
    failed or non-finite job scores -inf. KeyError: a tuning job has no row yet."""
    gradients = GRADIENTS if context in HAMS else (NO_GRADIENT,)
    scores = {}
    for lr in plan.lrs:
        keys = [_job(plan, "tune", context, g, lr, r).key
                for g in gradients for r in plan.tune_replicates]  # fmt: skip
        scores[lr] = sum(val_score(rows[k]) for k in keys) / len(keys)
    return scores


def select_lr(plan: Plan, rows: Rows, context: str) -> float:
    """The context's one rate (both gradients of a ham): the highest ``lr_scores`` (ties: the
    smaller rate). KeyError: a tuning job has no row yet."""
    scores = lr_scores(plan, rows, context)
    best = max(scores.values())
    return min(lr for lr, score in scores.items() if score == best)


def edge_selected(plan: Plan, rows: Rows, context: str) -> bool:
    """Whether the selected rate is an end of a grid of more than one rate."""
    grid = sorted(plan.lrs)
    return len(grid) > 1 and select_lr(plan, rows, context) in (grid[0], grid[-1])


# Errors that end a job for a reason outside its training (a job folder holding another
# config's checkpoints, a folder locked by another run, a kill): such a row says nothing about
# the rate, so it does not settle the tuning; the runner retries it.
NOT_AN_OUTCOME = ("ResumeConflictError", "JobLockedError", "PreemptedError", "KeyboardInterrupt",
                  "BrokenProcessPool", "Killed")  # fmt: skip


def settled(row: Mapping[str, Any] | None) -> bool:
    """Whether a tuning row is an outcome of training: ok, or failed in training (a non-finite
    loss, the skip limit), not stopped by its environment (``NOT_AN_OUTCOME``)."""
    if row is None:
        return False
    if row.get("status") == "ok":
        return True
    return not str(row.get("error") or "").startswith(NOT_AN_OUTCOME)


def tuned(plan: Plan, rows: Rows) -> bool:
    """Whether every tuning job has a settled row (``settled``); until then no rate is
    selected and no main, length or secondary job exists."""
    return all(settled(rows.get(job.key)) for job in tune_jobs(plan))


def main_jobs(plan: Plan, rows: Rows) -> list[Job]:
    """The primary design, replicate by replicate: baselines, then each ham's two gradients."""
    rates = {c: select_lr(plan, rows, c) for c in (*BASELINES, *HAMS)}
    return [_job(plan, "main", c, g, rates[c], r)
            for r in range(plan.replicates) for c, g in tuned_arms()]  # fmt: skip


def length_jobs(plan: Plan, rows: Rows) -> list[Job]:
    """Each ham's primary arms on the length replicates, ``length_factor`` times longer."""
    epochs = plan.length_factor * plan.main_epochs
    return [
        _job(plan, "length", ham, g, select_lr(plan, rows, ham), r, epochs=epochs)
        for r in plan.length_replicates
        for ham in HAMS
        for g in GRADIENTS
    ]


def secondary_jobs(plan: Plan, rows: Rows) -> list[Job]:
    """The exploratory arms on the secondary replicates, at each ham's selected rate."""
    jobs = []
    for r in plan.secondary_replicates:
        for ham in HAMS:
            lr = select_lr(plan, rows, ham)
            jobs.append(_job(plan, "secondary", ham, THROUGH_BASES, lr, r))
            if ham in ("vq", "cd"):
                jobs += [_job(plan, "secondary", ham, g, lr, r, inv_t=t)
                         for t in plan.secondary_inv_ts for g in GRADIENTS]  # fmt: skip
            jobs += [_job(plan, "secondary", ham, g, lr, r, k=k)
                     for k in plan.ks for g in GRADIENTS]  # fmt: skip
    return jobs


def jobs_of_stage(plan: Plan, rows: Rows, stage: str) -> list[Job]:
    """The jobs of one stage; the main, length and secondary stages exist once tuning has
    settled (else [])."""
    if stage == "pretrain":
        return pretrain_jobs(plan)
    if stage == "tune":
        return tune_jobs(plan)
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}; stages: {', '.join(STAGES)}")
    if not tuned(plan, rows):
        return []
    stages = {"main": main_jobs, "length": length_jobs, "secondary": secondary_jobs}
    return stages[stage](plan, rows)


def all_jobs(plan: Plan, rows: Rows) -> list[Job]:
    """Every job known from ``rows``, stage by stage."""
    return [job for stage in STAGES for job in jobs_of_stage(plan, rows, stage)]


def start_order(plan: Plan, job: Job) -> tuple[int, int, int]:
    """The runner's order: the tuning replicates' pretraining, tuning, then replicate by
    replicate its pretraining and primary arms (a stopped study leaves whole replicates), the
    length check, the secondary arms."""
    if job.stage == "pretrain" and job.replicate not in plan.tune_replicates:
        return (STAGES.index("main"), job.replicate, -1)
    return (STAGES.index(job.stage), job.replicate, 0)


def replicates_done(plan: Plan, rows: Rows, jobs: Sequence[Job]) -> int:
    """Test replicates whose jobs in ``jobs`` all have an ``ok`` row."""
    unfinished = {j.replicate for j in jobs if rows.get(j.key, {}).get("status") != "ok"}
    return len({j.replicate for j in jobs} - unfinished)
