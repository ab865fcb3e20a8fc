"""The experiments' structured configs, registered in Hydra's ConfigStore.

The configs of the library's objects are generated from its registries and signatures
(``experiments.config.signatures``), so they cannot drift from it: every solver (``solver`` group),
backward mode (``adjoint``), linear solver (``adjoint/linear_solver``, nested in ``implicit``),
decomposition and baseline context module (``context``, built by ``implicit_ham.make_context``)
has every constructor parameter as a field, with the library's default. The ``data`` and
``logger`` groups are generated from the signatures of ``experiments.data.splits`` and
``experiments.engine.sinks``, the ``penalty`` group from ``experiments.models.jacobian_penalty``.
Each option is stored as ``base_<name>`` in its group; the YAML files
in ``conf/<group>/<name>.yaml`` extend it with the experiments' own settings. OmegaConf rejects a
misspelt key or a wrong type at start-up, with its own message.

The root schema ``TrainConfig`` types each group field by the base its options derive from
(``experiments.config.typed``), so ``typed_config(cfg, TrainConfig)`` gives the engine one typed
object: ``cfg.context.name``, ``cfg.optim.lr``, ``cfg.diagnostics.every``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.utils import instantiate
from omegaconf import MISSING

import implicit_ham
from experiments.config.optim_checks import check_optimizer, refused_in
from experiments.config.signatures import Parameter, config_class, signature_parameters
from experiments.config.typed import ContextConf, OptimConf, TargetConf
from experiments.data import splits
from experiments.engine import sinks
from experiments.models.jacobian_penalty import JacobianPenalty
from implicit_ham.adjoints.modes import ADJOINTS
from implicit_ham.decompositions.registry import DECOMPOSITIONS
from implicit_ham.linalg.operator import LINEAR_SOLVERS
from implicit_ham.nn.context import CONTEXTS, MIXER_SUFFIX, decomposition_of
from implicit_ham.plugins import Registry, parameter_names
from implicit_ham.solvers.base import SOLVERS

# Set by the experiment when it builds the module, never from the command line.
CONTEXT_RUNTIME = ("channels", "spatial", "solver", "adjoint")


def registry_configs(registry: Registry[Any], **options: Any) -> dict[str, type]:
    """{registry name: generated config class} for every entry of ``registry``."""
    return {name: config_class(registry.get(name), **options) for name in registry.names()}


def context_configs() -> dict[str, type]:
    """One ``make_context`` config per decomposition (the ``Hamburger`` block's options, then
    the decomposition's), per decomposition as a token mixer ("<name>_mixer": the ``HamMixer``'s
    options, then the decomposition's) and per baseline (its own options)."""
    make = signature_parameters(implicit_ham.make_context)
    block = [
        p
        for p in make + signature_parameters(implicit_ham.Hamburger)
        if p.name not in ("name", "channels", "ham", "channel_ham")
    ]
    mixer = [
        p
        for p in make + signature_parameters(implicit_ham.HamMixer)
        if p.name not in ("name", "channels", "ham", "dual")
    ]
    configs = {}
    for name in DECOMPOSITIONS.names():
        decomposition = DECOMPOSITIONS.get(name)
        own = [p for p in signature_parameters(decomposition) if p.name not in CONTEXT_RUNTIME]
        label = decomposition.__name__
        configs[name] = _context_config(name, f"{label}ContextConf", ("channels",), block + own)
        mixer_name = f"{name}{MIXER_SUFFIX}"
        configs[mixer_name] = _context_config(
            mixer_name, f"{label}MixerContextConf", ("channels", "dual"), mixer + own
        )
    for name in CONTEXTS.names():
        baseline = CONTEXTS.get(name)
        own = [p for p in signature_parameters(baseline) if p.name != "channels"]
        configs[name] = _context_config(
            name, f"{baseline.__name__}ContextConf", ("channels", "dual"), own
        )
    return configs


def _context_config(
    name: str, label: str, exclude: tuple[str, ...], extra: list[Parameter]
) -> type:
    """The ``make_context`` config of the context ``name``, as the class ``label``."""
    return config_class(
        implicit_ham.make_context,
        base=ContextConf,
        name=label,
        exclude=exclude,
        fixed={"name": name},
        extra=extra,
    )


LOGGER_TARGETS = {"files": sinks.file_sinks, "wandb": sinks.wandb_sinks, "none": sinks.no_sinks}
DATA_TARGETS = {
    name: getattr(splits, name)
    for name in (
        "legend_seg",
        "digits",
        "digit_seg",
        "cifar10",
        "voc2012",
        "h3_induction",
        "h3_associative_recall",
        "mnist1d",
        "far_twins_masked",
        "far_twins_pairing",
    )
}


# ----------------------------------------------------------------------------- model, optim


@dataclass
class ModelConf:
    """The network around the context module.

    ``arch`` (segmentation only; classifiers are always backbone -> context -> pool):
    ``two_stream`` (``TwoStreamSegmenter``: the context module reads a colour histogram and a
    position code, ``colour_bins ** 3 + position_grid ** 2`` channels for RGB, the backbone's
    ``width`` features go to the head beside it) or ``serial`` (``ContextSegmenter``: backbone ->
    context on ``width`` channels -> head). On legend_seg only ``two_stream`` learns the legend
    in a short run (why: ``experiments/models/two_stream.py``).

    Pretrained backbone (``serial`` only; all three default to None, i.e. off, so configs
    written before these options existed compare equal on resume): ``pretrained``, the path of
    an ``experiments.pretrain`` artefact loaded into the backbone; ``freeze_backbone``: its
    parameters get no gradient and its BatchNorm statistics stay fixed; ``backbone_lr_scale``:
    the backbone's learning rate is the optimiser's times this factor (fine-tuning).

    Sequence models (the public benchmarks, ``experiments.models.sequence`` / ``deq1d``; any
    task kind "classification" with sequence inputs): ``arch=transformer`` (token ids: a
    pre-norm transformer of ``layers`` blocks (None: 2) whose mixer is the context, scored on
    the final position; ``dropout`` on the embeddings, None: 0), ``cnn1d`` (a 1-D CNN with the
    context as its global block), ``mlp``, ``gru`` (baselines) and ``deq1d`` (a convolutional
    DEQ under the run's solver and adjoint; ``stabilise`` None or "spectral", ``gain`` the
    cell's factor, None: 0.5). All new fields default to None so earlier configs compare equal.

    ``channels_last``: the network's 4-D weights and activations in the channels-last memory
    format (``torch.channels_last``), which the CPU convolutions run faster in (the paper-regime
    segmenter's training step: 1.46x with the identity as context; whole 4-epoch jobs of the
    paper preset 1.07-1.27x, the ham's share unchanged); the context module gets its
    input in that format and answers in it (``implicit_ham`` keeps a channels-last input's
    format). The values
    equal the default format's up to float rounding, not bitwise; None (the default) is off, so
    earlier configs compare equal on resume.

    ``init_seed`` (the masked-cell and pairing models only, ``experiments.models.masked_cell``):
    seeds the initialisation of the layers every context arm shares, so arms paired by seed
    start from the same shared weights (None: 0).
    """

    width: int = 32
    arch: str = "two_stream"
    colour_bins: int = 3
    position_grid: int = 8
    colour_scale: float = 3.0
    pretrained: str | None = None
    freeze_backbone: bool | None = None
    backbone_lr_scale: float | None = None
    channels_last: bool | None = None
    layers: int | None = None
    dropout: float | None = None
    stabilise: str | None = None
    gain: float | None = None
    init_seed: int | None = None


@dataclass
class AdamConf(OptimConf):
    """``torch.optim.AdamW``."""

    _target_: str = "torch.optim.AdamW"
    lr: float = 3e-3
    weight_decay: float = 1e-4


@dataclass
class SGDConf(OptimConf):
    """``torch.optim.SGD`` with momentum."""

    _target_: str = "torch.optim.SGD"
    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 1e-4


# ----------------------------------------------------------------------------- diagnostics, study


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
    ``implicit_ham.reliability.failures``). checkpoint_every: also checkpoint every N steps
    (0: at epoch ends only). keep: checkpoints kept. resume: continue from the job
    directory's newest checkpoint. deterministic: ``torch.use_deterministic_algorithms``.
    warn_first / warn_every: rate limit of the failure warnings. preempt_signals: signals that
    stop the run gracefully at the next step boundary (checkpoint, ``results.json`` with
    ``status: "preempted"``, exit status 128 + signal number; see
    ``experiments.engine.preemption``); [] keeps Python's default handlers.
    max_consecutive_skips / max_skips: the run fails (``status: "failed"``, the reason in
    ``error``) once the failure policy skipped that many batches in a row / in total (0: no
    limit).
    dist_timeout_s: seconds a collective of a data-parallel run may wait for a peer before the
    run fails with ``DistributedTimeoutError`` naming the rank(s) that did not answer.
    divergence_factor / divergence_steps: a finite training loss above divergence_factor x its
    lowest smoothed value for divergence_steps steps in a row is a ``loss_diverged`` failure
    event under on_failure (``implicit_ham.reliability.LossDivergence``; divergence_steps=0:
    no check).
    world_size_change: a resume with another process count is "refuse"d (``ResumeConflictError``)
    or "reshard"ed (the sampler re-slices the remaining batches; not bit-identical).
    threads_change: a resume with another ``torch.get_num_threads()`` than the checkpoint's is
    "refuse"d (the float reduction order, hence the weights, would change) or runs with a
    "warn"ing naming both numbers.
    """

    on_failure: str = "warn"
    checkpoint_every: int = 0
    keep: int = 2
    resume: bool = True
    deterministic: bool = True
    warn_first: int = 3
    warn_every: int = 100
    preempt_signals: list[str] = field(default_factory=lambda: ["SIGUSR1", "SIGTERM", "SIGINT"])
    max_consecutive_skips: int = 10
    max_skips: int = 0
    dist_timeout_s: float = 300.0
    divergence_factor: float = 10.0
    divergence_steps: int = 10
    world_size_change: str = "refuse"
    threads_change: str = "refuse"


@dataclass
class TrainConfig:
    """The root config of ``experiments.train`` (group fields are filled by the defaults).

    ``dtype``: "float32" (default) or "float64", the precision of the model's parameters and
    input images; float64 gives reference runs free of float32 rounding (e.g. to check that
    data-parallel training equals one process, see
    ``tests/experiments/engine/test_distributed.py``).
    ``lr_poly_power``: when set, the paper's poly schedule: before step t (of T in the run) every
    parameter group's learning rate is its initial one times ``(1 - t / T) ** lr_poly_power``
    (None, the default: constant learning rate).
    ``clip_grad_norm``: when set, after every backward pass the gradients' joint 2-norm is
    clipped to it (``experiments.engine.clipping``); None (the default): no clipping.
    ``stop_at_accuracy``: when set, training ends after the first epoch whose validation
    accuracy reaches it (early stopping; a classification task; None, the default: never).
    ``penalty``: a term added to the training loss, None (the default) or ``penalty=jacobian``
    (``experiments.models.jacobian_penalty.JacobianPenalty``: ``penalty.weight``,
    ``penalty.every``, ``penalty.samples``), for a model with an implicit layer.
    """

    context: ContextConf = MISSING
    adjoint: TargetConf = MISSING
    solver: TargetConf = MISSING
    data: TargetConf = MISSING
    model: ModelConf = field(default_factory=ModelConf)
    optim: OptimConf = MISSING
    logger: TargetConf = MISSING
    diagnostics: DiagnosticsConf = MISSING
    seed: int = 0
    device: str = "cpu"
    epochs: int = 4
    batch_size: int = 32
    threads: int | None = None
    dtype: str = "float32"
    log_every: int = 10
    progress: bool = True
    checkpoint: str | None = None
    lr_poly_power: float | None = None
    clip_grad_norm: float | None = None
    penalty: TargetConf | None = None
    stop_at_accuracy: float | None = None
    study: StudyConf = field(default_factory=StudyConf)
    reliability: ReliabilityConf = field(default_factory=ReliabilityConf)


def check_train_config(cfg: TrainConfig) -> None:
    """Refuse values that typing cannot catch before a job starts: ``epochs`` and
    ``batch_size`` must be >= 1 (with ``epochs=0`` there would be no validation metrics to
    report). A config built by hand is not type-checked by OmegaConf, hence the type test."""
    for key, value in (("epochs", cfg.epochs), ("batch_size", cfg.batch_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(
                f"{key}={value!r}: must be an integer >= 1; e.g. {key}=1 on the command line"
            )


def check_components(cfg: TrainConfig) -> None:
    """Build the run's solver, backward mode and (for a decomposition context) the
    decomposition once, without data, so that a value the library refuses
    (``context.steps=-1``, ``adjoint.k=0``) fails at start-up naming its config group, not
    after the data is built; and the optimiser and schedule values
    (``experiments.config.optim_checks.check_optimizer``: ``optim.lr=-1``,
    ``optim.momentum=1.5``, ``lr_poly_power=0``). Call it after ``check_targets`` (it
    instantiates ``_target_``s)."""
    check_optimizer(cfg.optim, cfg.lr_poly_power, cfg.model.backbone_lr_scale)
    built: dict[str, Any] = {}
    for group in ("solver", "adjoint"):
        with refused_in(group):
            built[group] = instantiate(getattr(cfg, group))
    name = decomposition_of(cfg.context.name)
    if name is None:
        return
    accepted = set(parameter_names(DECOMPOSITIONS.get(name))) - {"channels", "solver", "adjoint"}
    options = {k: v for k, v in dataclasses.asdict(cfg.context).items() if k in accepted}
    with refused_in("context"):
        DECOMPOSITIONS.make(name, **options, solver=built["solver"], adjoint=built["adjoint"])


def config_groups() -> dict[str, dict[str, type]]:
    """{group: {option: config class}}, generated from what is registered now (so a plug-in
    registered before ``register_configs()`` gets its ``base_<name>`` too)."""
    return {
        "context": context_configs(),
        "adjoint": registry_configs(ADJOINTS),
        "adjoint/linear_solver": registry_configs(LINEAR_SOLVERS),
        "solver": registry_configs(SOLVERS),
        "data": {name: config_class(target) for name, target in DATA_TARGETS.items()},
        "optim": {"adam": AdamConf, "sgd": SGDConf},
        "logger": {
            name: config_class(target, exclude=("directory", "config"))
            for name, target in LOGGER_TARGETS.items()
        },
        "diagnostics": {"default": DiagnosticsConf},
        "penalty": {"jacobian": config_class(JacobianPenalty)},
    }


def register_configs() -> None:
    """Store every schema in Hydra's ConfigStore (idempotent)."""
    store = ConfigStore.instance()
    store.store(name="train_schema", node=TrainConfig)
    for group, options in config_groups().items():
        for option, schema in options.items():
            store.store(group=group, name=f"base_{option}", node=schema)
