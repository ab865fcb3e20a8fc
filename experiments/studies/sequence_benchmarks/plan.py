"""The plan of the public-benchmark study (issue 51): which training jobs, with which Hydra
overrides of ``conf/config.yaml``, and what they cost.

H3 synthetics (``data=h3_induction``, ``data=h3_associative_recall``; the published data, scored
on the final position): the transformer of the safari configs (2 layers, d_model 32, one head,
MLP 4 d, embedding dropout 0.1; AdamW lr 5e-4, weight decay 0.1, batch 32) with

* ``attention`` (SDPA mixer) at the published epochs (induction 400, associative recall 200);
* ``linear_attention``, ``none`` (no mixer) and the NMF / VQ / CD Hamburger mixers under OneStep
  (the paper's gradient), Unroll (BPTT) and Implicit, all at one **equal** budget of
  ``h3_epochs`` epochs (the published epochs do not fit the time budget: see ``cost``);

every arm stops early at 100 % test accuracy (``stop_at_accuracy=1.0``). MNIST-1D: the MLP /
CNN / GRU sanity rows, the convolutional DEQ under each backward mode with and without the
spectral norm, and on the shuffled variant the 1-D CNN with each global-context block; all at
``mnist_epochs`` epochs, batch 100, AdamW lr 3e-3. Every arm has ``seeds`` seeds (model
initialisation and batch order; the data are the published splits).

Deviations from the safari configs, stated on the page: constant learning rate (no warm-up /
cosine decay), no attention dropout (the SDPA mixer has none), the loss on the final position
only (a bidirectional mixer would read the other targets).
"""

from __future__ import annotations

import argparse
import hashlib
import json
from dataclasses import asdict, dataclass, field

STUDY = "sequence_benchmarks"
H3_TASKS = {"h3_induction": 400, "h3_associative_recall": 200}  # published epochs
H3_COMMON = (
    "model.arch=transformer", "model.width=32", "model.layers=2", "model.dropout=0.1",
    "optim=adam", "optim.lr=5e-4", "optim.weight_decay=0.1", "batch_size=32",
    "stop_at_accuracy=1.0",
)  # fmt: skip
MNIST_COMMON = ("optim=adam", "optim.lr=3e-3", "batch_size=100", "stop_at_accuracy=1.0")
DEQ_SOLVER = ("solver=fixed_point", "solver.max_steps=20", "solver.tol=1e-3")
ADJOINTS = ("one_step", "unroll", "implicit")
DEQ_ADJOINTS = ("unroll", "one_step", "phantom", "neumann", "implicit")

# Seconds per training epoch, one thread, measured in this project's session of 2026-12-07 on a
# 2-core machine shared with other agents' jobs (so an upper bound for 2 idle cores): 1-2 epoch
# jobs of the plan's own configurations and the runner's job settings, the numbers typed in
# here (a projection only; the page's measured wall time is the CSV's). H3 on the induction
# head, the associative-recall jobs scaled by ``AR_SHARE`` (measured there: 0.64x for attention,
# 0.59x for NMF one-step). Arms not measured take their family's value (VQ / CD as NMF;
# VQ one-step measured 24.1 s on the induction head).
EPOCH_S = {
    "h3/attention": 4.5,
    "h3/linear_attention": 16.4,
    "h3/none": 6.5,
    "h3/one_step": 18.5,
    "h3/unroll": 33.2,
    "h3/implicit": 110.0,  # CD; NMF 84.9
    "mnist/mlp": 0.84,
    "mnist/cnn": 1.05,
    "mnist/gru": 5.5,
    "mnist/deq_one_step": 10.3,
    "mnist/deq_unroll": 21.3,
    "mnist/deq_phantom": 8.3,
    "mnist/deq_neumann": 6.4,
    "mnist/deq_implicit": 44.6,
    "mnist/cnn_context": 5.1,
}
AR_SHARE = 22 / 31  # associative recall's tokens per sequence / induction head's


@dataclass(frozen=True)
class Job:
    """One training job: ``key`` names it in the CSV; ``replicate`` is its seed."""

    benchmark: str
    arm: str
    seed: int
    epochs: int
    overrides: tuple[str, ...]
    family: str
    stage: str = "main"

    @property
    def key(self) -> str:
        return f"{self.benchmark}/{self.arm}/s{self.seed}"

    @property
    def replicate(self) -> int:
        return self.seed


@dataclass(frozen=True)
class Plan:
    """What the study runs. ``h3_epochs``: the equal budget of every non-attention H3 arm;
    ``attention_epochs``: None for the published epochs; ``overrides``: added to every job (the
    tests' tiny sizes)."""

    seeds: tuple[int, ...] = (0, 1, 2)
    h3_epochs: int = 10
    attention_epochs: int | None = None
    mnist_epochs: int = 20
    benchmarks: tuple[str, ...] = (
        "h3_induction", "h3_associative_recall", "mnist1d", "mnist1d_shuffled",
    )  # fmt: skip
    overrides: tuple[str, ...] = field(default=())

    def digest(self) -> str:
        """A short hash of the plan (rows of another plan are not mixed in)."""
        text = json.dumps(asdict(self), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:12]


Arms = dict[str, tuple[str, tuple[str, ...]]]


def add_plan_arguments(parser: argparse.ArgumentParser) -> None:
    """The plan's command-line options (the runner and the report must be given the same)."""
    parser.add_argument(
        "--h3-epochs",
        type=int,
        default=Plan.h3_epochs,
        help="the equal epoch budget of the non-attention H3 arms",
    )
    parser.add_argument("--mnist-epochs", type=int, default=Plan.mnist_epochs)
    names = list(Plan.benchmarks)
    parser.add_argument(
        "--benchmarks", nargs="+", default=names, choices=names, help="run only these"
    )


def plan_of(args: argparse.Namespace) -> Plan:
    """The plan of the parsed options (``add_plan_arguments``)."""
    return Plan(h3_epochs=args.h3_epochs, mnist_epochs=args.mnist_epochs,
                benchmarks=tuple(args.benchmarks))  # fmt: skip


def h3_arms() -> Arms:
    """{arm: (family, overrides)} of an H3 task."""
    arms: Arms = {
        "attention": ("attention", ("context=sdpa_mixer",)),
        "linear_attention": ("linear_attention", ("context=linear_attention_mixer",)),
        "none": ("none", ("context=none",)),
    }
    for ham in ("nmf", "vq", "cd"):
        for adjoint in ADJOINTS:
            arms[f"{ham}_{adjoint}"] = (adjoint, (f"context={ham}_mixer", f"adjoint={adjoint}"))
    return arms


def mnist_arms() -> Arms:
    """{arm: (family, overrides)} of MNIST-1D (default data)."""
    arms: Arms = {
        "mlp": ("mlp", ("model.arch=mlp", "model.width=100", "context=none")),
        "cnn": ("cnn", ("model.arch=cnn1d", "model.width=32", "context=none")),
        "gru": ("gru", ("model.arch=gru", "model.width=64", "context=none")),
    }
    for adjoint in DEQ_ADJOINTS:
        for stabilise in ("none", "spectral"):
            extra = ("model.stabilise=spectral",) if stabilise == "spectral" else ()
            arms[f"deq_{adjoint}_{stabilise}"] = (
                f"deq_{adjoint}",
                ("model.arch=deq1d", "model.width=32", "context=none", *DEQ_SOLVER,
                 f"adjoint={adjoint}", *extra),
            )  # fmt: skip
    return arms


def shuffled_arms() -> Arms:
    """{arm: (family, overrides)} of shuffled MNIST-1D: the 1-D CNN with each context."""
    contexts: dict[str, tuple[str, ...]] = {
        "none": ("context=none",),
        "self_attention": ("context=sdpa_attention",),
        "nmf_one_step": ("context=nmf", "adjoint=one_step"),
        "nmf_bptt": ("context=nmf", "adjoint=unroll"),
        "vq": ("context=vq", "adjoint=one_step"),
        "cd": ("context=cd", "adjoint=one_step"),
    }
    return {
        name: ("cnn" if name == "none" else "cnn_context",
               ("model.arch=cnn1d", "model.width=32", *extra))
        for name, extra in contexts.items()
    }  # fmt: skip


def jobs(plan: Plan) -> list[Job]:
    """Every job of the plan, seed-major (all arms' seed 0 first, so a partial run covers
    every arm)."""
    out = []
    for seed in plan.seeds:
        for benchmark in plan.benchmarks:
            out.extend(_jobs_of(plan, benchmark, seed))
    return out


def _jobs_of(plan: Plan, benchmark: str, seed: int) -> list[Job]:
    common = (f"seed={seed}", *plan.overrides)
    if benchmark in H3_TASKS:
        result = []
        for arm, (family, extra) in h3_arms().items():
            published = plan.attention_epochs or H3_TASKS[benchmark]
            epochs = published if arm == "attention" else plan.h3_epochs
            overrides = (f"data={benchmark}", *H3_COMMON, *extra, f"epochs={epochs}", *common)
            result.append(Job(benchmark, arm, seed, epochs, overrides, f"h3/{family}"))
        return result
    if benchmark not in ("mnist1d", "mnist1d_shuffled"):
        raise ValueError(f"unknown benchmark {benchmark!r}")
    arms = mnist_arms() if benchmark == "mnist1d" else shuffled_arms()
    data = ("data=mnist1d", f"data.shuffle_seq={benchmark == 'mnist1d_shuffled'}")
    return [
        Job(benchmark, arm, seed, plan.mnist_epochs,
            (*data, *MNIST_COMMON, *extra, f"epochs={plan.mnist_epochs}", *common),
            f"mnist/{family}")
        for arm, (family, extra) in arms.items()
    ]  # fmt: skip


def job_cost_s(job: Job) -> float:
    """The projected worst-case seconds of ``job`` (no early stop), from ``EPOCH_S``."""
    share = AR_SHARE if job.benchmark == "h3_associative_recall" else 1.0
    return EPOCH_S[job.family] * job.epochs * share


def cost(plan: Plan, workers: int = 2) -> dict[str, float]:
    """Projected worst-case wall minutes per benchmark and in all, ``workers`` jobs at once."""
    minutes: dict[str, float] = {}
    for job in jobs(plan):
        minutes[job.benchmark] = minutes.get(job.benchmark, 0.0) + job_cost_s(job) / 60 / workers
    minutes["total"] = sum(minutes.values())
    return minutes
