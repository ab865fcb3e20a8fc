"""Structured configs of the experiments, registered in Hydra's ConfigStore.

Every option of every config group (``context``, ``adjoint``, ``solver``, ``data``, ``model``,
``optim``, ``logger``, ``diagnostics``) has a dataclass schema here, stored in its group as
``base_<option>``; the YAML files in ``conf/<group>/<option>.yaml`` extend it. Hydra then
rejects a misspelt key or a wrong type at start-up, with its own message.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

# ----------------------------------------------------------------------------- context


@dataclass
class HamContext:
    """A Hamburger block around a decomposition (nmf, vq, cd, svd, or a registered plug-in).

    K is ``steps`` (training) / ``eval_steps`` (evaluation); it replaces the solver's max_steps.
    """

    name: str = "nmf"
    version: str = "v2"
    rank: int = 8
    steps: int = 6
    eval_steps: int = 6
    groups: int = 1
    inv_t: float | None = None
    eps: float = 1e-6
    init: str = "random"
    grad_through_bases: bool = False
    ham_channels: int | None = None
    lower_relu: bool = True
    dual: bool = False


@dataclass
class CDContext(HamContext):
    """The CD ham, with its ridge parameter."""

    name: str = "cd"
    beta: float = 0.1


@dataclass
class RidgeNMFContext(HamContext):
    """The ridge-regularised NMF ham (an argmin under non-negativity), with its ridge weight."""

    name: str = "nmf_ridge"
    lam: float = 0.1


@dataclass
class AttentionContext:
    """Self-attention baselines: ``self_attention`` (N x N matrix) or ``sdpa_attention``."""

    name: str = "self_attention"
    inner_channels: int | None = None
    heads: int = 1


@dataclass
class NoContext:
    """No context module (identity): the local-only baseline."""

    name: str = "none"


# ----------------------------------------------------------------------------- adjoint


@dataclass
class UnrollConf:
    _target_: str = "implicit_ham.Unroll"


@dataclass
class OneStepConf:
    _target_: str = "implicit_ham.OneStep"


@dataclass
class TruncatedConf:
    _target_: str = "implicit_ham.Truncated"
    k: int = 2


@dataclass
class PhantomConf:
    _target_: str = "implicit_ham.Phantom"
    k: int = 5
    tau: float = 0.5


@dataclass
class NeumannConf:
    _target_: str = "implicit_ham.Neumann"
    k: int = 5
    tau: float = 0.5


@dataclass
class ImplicitConf:
    _target_: str = "implicit_ham.Implicit"
    linear_solver: str = "gmres"
    max_steps: int = 100
    tol: float = 1e-5
    on_divergence: str = "warn"
    cond_threshold: float | None = 1e6
    ridge: float = 0.0


# ----------------------------------------------------------------------------- solver


@dataclass
class FixedPointConf:
    _target_: str = "implicit_ham.FixedPointIteration"
    max_steps: int = 6
    tol: float | None = None
    damping: float = 1.0
    stop_mode: str = "rel"


@dataclass
class AndersonConf:
    _target_: str = "implicit_ham.Anderson"
    max_steps: int = 30
    tol: float | None = 1e-5
    m: int = 5
    lam: float = 1e-4
    damping: float = 1.0
    stop_mode: str = "rel"


@dataclass
class BroydenConf:
    _target_: str = "implicit_ham.Broyden"
    max_steps: int = 30
    tol: float | None = 1e-5
    stop_mode: str = "rel"


# ----------------------------------------------------------------------------- data


@dataclass
class LegendSegConf:
    """The embedded task: segment blobs by matching their texture to a legend strip."""

    name: str = "legend_seg"
    train_size: int = 1024
    val_size: int = 128
    image_size: int = 64
    num_classes: int = 4
    seed: int = 0


@dataclass
class DigitsConf:
    name: str = "digits"
    val_fraction: float = 0.2
    seed: int = 0


@dataclass
class Cifar10Conf:
    name: str = "cifar10"
    root: str = MISSING


@dataclass
class Voc2012Conf:
    name: str = "voc2012"
    root: str = MISSING
    size: int = 128
    resize_mode: str = "center_crop"


# ----------------------------------------------------------------------------- model, optim


@dataclass
class ModelConf:
    """The network around the context module.

    ``arch`` (segmentation only; classifiers are always backbone -> context -> pool):
    ``two_stream`` (``TwoStreamSegmenter``: the context module reads a colour histogram and a
    position code, ``colour_bins ** 3 + position_grid ** 2`` channels for RGB, the backbone's
    ``width`` features go to the head beside it) or ``serial`` (``ContextSegmenter``: backbone ->
    context on ``width`` channels -> head). On legend_seg only ``two_stream`` learns the legend
    in a short run (why: ``implicit_ham/models/two_stream.py``).
    """

    width: int = 32
    arch: str = "two_stream"
    colour_bins: int = 3
    position_grid: int = 8
    colour_scale: float = 3.0


@dataclass
class AdamConf:
    _target_: str = "torch.optim.AdamW"
    _partial_: bool = True
    lr: float = 3e-3
    weight_decay: float = 1e-4


@dataclass
class SGDConf:
    _target_: str = "torch.optim.SGD"
    _partial_: bool = True
    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 1e-4


# ----------------------------------------------------------------------------- logging


@dataclass
class FilesLogger:
    """JSONL and CSV metric files in the job's directory."""

    kind: str = "files"


@dataclass
class WandbLogger:
    """Files plus wandb (offline unless WANDB_API_KEY is set or mode is given)."""

    kind: str = "wandb"
    project: str = "implicit-ham"
    group: str | None = None
    tags: list[str] = field(default_factory=list)
    mode: str | None = None


@dataclass
class NoLogger:
    """Console only (results.json is still written)."""

    kind: str = "none"


@dataclass
class DiagnosticsConf:
    """Gradient norms and solver statistics every ``every`` steps; conditioning optionally."""

    enabled: bool = True
    every: int = 10
    conditioning_every: int | None = None
    layer_hooks: bool = True


@dataclass
class StudyConf:
    """Options of ``experiments.grad_study`` and ``experiments.convergence``."""

    ks: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32])
    samples: int = 2
    reference_steps: int = 500
    conditioning: bool = True
    max_steps: int = 60


@dataclass
class ReliabilityConf:
    """Failure policy, checkpoints, resume and determinism of ``experiments.train``.

    on_failure: "warn" | "raise" | "skip_batch" | "fallback" (see
    ``implicit_ham.training.failures``). checkpoint_every: also checkpoint every N steps
    (0: at epoch ends only). keep: checkpoints kept. resume: continue from the job
    directory's newest checkpoint. deterministic: ``torch.use_deterministic_algorithms``.
    warn_first / warn_every: rate limit of the failure warnings.
    """

    on_failure: str = "warn"
    checkpoint_every: int = 0
    keep: int = 2
    resume: bool = True
    deterministic: bool = True
    warn_first: int = 3
    warn_every: int = 100


# ----------------------------------------------------------------------------- root


@dataclass
class TrainConfig:
    """The root config of ``experiments.train`` (group fields are filled by the defaults).

    ``dtype``: "float32" (default) or "float64", the precision of the model's parameters and
    input images in ``experiments.train``; float64 gives reference runs free of float32
    rounding (e.g. to check that data-parallel training equals one process, see
    ``tests/test_rel_distributed.py``).
    """

    context: Any = MISSING
    adjoint: Any = MISSING
    solver: Any = MISSING
    data: Any = MISSING
    model: ModelConf = field(default_factory=ModelConf)
    optim: Any = MISSING
    logger: Any = MISSING
    diagnostics: Any = MISSING
    seed: int = 0
    device: str = "cpu"
    epochs: int = 4
    batch_size: int = 32
    threads: int | None = None
    dtype: str = "float32"
    log_every: int = 10
    progress: bool = True
    checkpoint: str | None = None
    study: StudyConf = field(default_factory=StudyConf)
    reliability: ReliabilityConf = field(default_factory=ReliabilityConf)


GROUPS: dict[str, dict[str, type]] = {
    "context": {
        "nmf": HamContext,
        "vq": HamContext,
        "cd": CDContext,
        "svd": HamContext,
        "nmf_normalized": HamContext,
        "nmf_ridge": RidgeNMFContext,
        "self_attention": AttentionContext,
        "sdpa_attention": AttentionContext,
        "none": NoContext,
    },
    "adjoint": {
        "unroll": UnrollConf,
        "one_step": OneStepConf,
        "truncated": TruncatedConf,
        "phantom": PhantomConf,
        "neumann": NeumannConf,
        "implicit": ImplicitConf,
    },
    "solver": {"fixed_point": FixedPointConf, "anderson": AndersonConf, "broyden": BroydenConf},
    "data": {
        "legend_seg": LegendSegConf,
        "digits": DigitsConf,
        "cifar10": Cifar10Conf,
        "voc2012": Voc2012Conf,
    },
    "optim": {"adam": AdamConf, "sgd": SGDConf},
    "logger": {"files": FilesLogger, "wandb": WandbLogger, "none": NoLogger},
    "diagnostics": {"default": DiagnosticsConf},
}


def register_configs() -> None:
    """Store every schema in Hydra's ConfigStore (idempotent)."""
    store = ConfigStore.instance()
    store.store(name="train_schema", node=TrainConfig)
    for group, options in GROUPS.items():
        for option, schema in options.items():
            store.store(group=group, name=f"base_{option}", node=schema)
