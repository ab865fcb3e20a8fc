"""The root schema of ``experiments.generate`` and its start-up checks.

The context module, backward mode, forward solver and logger come from the same generated
config groups as ``experiments.train`` (``experiments.config.groups``: generated from the library's
signatures), so ``+arm=nmf_one_step`` etc. select a GAN arm exactly as they select a
segmentation arm. The GAN's own settings are the dataclasses below; OmegaConf rejects unknown
keys and wrong types, ``check_generate_config`` the values typing cannot catch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING

from experiments.config.groups import ReliabilityConf
from experiments.config.typed import ContextConf, TargetConf
from implicit_ham.reliability.failures import check_policy


@dataclass
class GanConf:
    """Networks and optimisation (hinge loss, Adam, TTUR learning rates as SAGAN)."""

    z_dim: int = 128
    g_width: int = 48
    d_width: int = 48
    lr_g: float = 2e-4
    lr_d: float = 4e-4
    beta1: float = 0.0
    beta2: float = 0.9
    ema_decay: float = 0.99
    max_consecutive_failures: int = 50


@dataclass
class CanvasConf:
    """The twin-digit canvases (``experiments.data.twin_digits``): ``train_size`` training
    canvases, ``val_size`` real reference canvases (held-out digits) for the metrics."""

    train_size: int = 8192
    val_size: int = 2000
    val_fraction: float = 0.2
    seed: int = 0


@dataclass
class GenMetricsConf:
    """Evaluation: ``samples`` EMA-generator samples at the end, ``curve_samples`` every
    ``eval_every`` steps (0: only at the end); k of the k-NN precision / recall; KID subsets;
    the digit classifier's training epochs and the held-out accuracy it must reach (the run
    stops with an error below it); ``classifier_cache``: where the trained classifier is kept
    (default: ``classifier.pt`` beside the job directory, shared by a sweep's jobs; a relative
    path is taken from the job directory, and it must stay under the run or
    ``$IMPLICIT_HAM_CACHE_DIR``, ``experiments.engine.paths``)."""

    samples: int = 2000
    curve_samples: int = 500
    eval_every: int = 200
    knn_k: int = 3
    kid_subsets: int = 50
    kid_subset_size: int = 500
    classifier_epochs: int = 30
    min_classifier_accuracy: float = 0.98
    classifier_cache: str | None = None
    grid: int = 8


@dataclass
class GenerateConfig:
    """The root config of ``experiments.generate`` (group fields are filled by the defaults;
    their types are the bases of the group options, see ``experiments.config.typed``)."""

    context: ContextConf = MISSING
    adjoint: TargetConf = MISSING
    solver: TargetConf = MISSING
    logger: TargetConf = MISSING
    gan: GanConf = field(default_factory=GanConf)
    canvas: CanvasConf = field(default_factory=CanvasConf)
    metrics: GenMetricsConf = field(default_factory=GenMetricsConf)
    seed: int = 0
    steps: int = 800
    batch_size: int = 32
    device: str = "cpu"
    threads: int | None = None
    log_every: int = 25
    reliability: ReliabilityConf = field(default_factory=ReliabilityConf)


def _require(ok: bool, key: str, value: Any, rule: str, example: str) -> None:
    if not ok:
        raise ValueError(f"{key}={value!r}: {rule}; e.g. {example} on the command line")


def _int_at_least(section: object, key: str, minimum: int, example: str) -> None:
    """``key`` (``name`` or ``section.name``) of the config: the field ``name`` of ``section``
    must be an integer >= ``minimum`` (a config built by hand is not type-checked)."""
    value = getattr(section, key.rpartition(".")[2])
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= minimum
    _require(ok, key, value, f"must be an integer >= {minimum}", example)


def check_generate_config(cfg: GenerateConfig) -> None:
    """Refuse, before anything is written, the values typing cannot catch: counts below their
    minimum, learning rates <= 0, Adam betas or the EMA decay outside [0, 1), a KNN k too large
    for the sample sets, an unknown failure policy."""
    _int_at_least(cfg, "steps", 1, "steps=1000")
    _int_at_least(cfg, "batch_size", 2, "batch_size=64")
    _int_at_least(cfg, "log_every", 1, "log_every=25")
    gan, canvas, metrics = cfg.gan, cfg.canvas, cfg.metrics
    for key in ("z_dim", "g_width", "d_width", "max_consecutive_failures"):
        _int_at_least(gan, f"gan.{key}", 2 if key == "g_width" else 1, f"gan.{key}=64")
    for key in ("lr_g", "lr_d"):
        rate = getattr(gan, key)
        _require(rate > 0, f"gan.{key}", rate, "must be > 0", f"gan.{key}=2e-4")
    for key in ("beta1", "beta2", "ema_decay"):
        value = getattr(gan, key)
        _require(0 <= value < 1, f"gan.{key}", value, "must lie in [0, 1)", f"gan.{key}=0.9")
    _int_at_least(canvas, "canvas.train_size", 2, "canvas.train_size=8192")
    _int_at_least(canvas, "canvas.val_size", 2, "canvas.val_size=2000")
    _int_at_least(canvas, "canvas.seed", 0, "canvas.seed=0")
    frac = canvas.val_fraction
    _require(
        0 < frac < 1, "canvas.val_fraction", frac, "must lie in (0, 1)", "canvas.val_fraction=0.2"
    )
    _int_at_least(metrics, "metrics.knn_k", 1, "metrics.knn_k=3")
    smallest = metrics.knn_k + 1
    for key in ("samples", "curve_samples"):
        _int_at_least(metrics, f"metrics.{key}", smallest, f"metrics.{key}=500 (> metrics.knn_k)")
    _require(
        canvas.val_size > metrics.knn_k,
        "canvas.val_size",
        canvas.val_size,
        "must exceed metrics.knn_k",
        "canvas.val_size=2000",
    )
    _int_at_least(metrics, "metrics.eval_every", 0, "metrics.eval_every=500 (0: only at the end)")
    for key in ("kid_subsets", "kid_subset_size", "classifier_epochs", "grid"):
        _int_at_least(
            metrics, f"metrics.{key}", 1 if key != "kid_subset_size" else 2, f"metrics.{key}=8"
        )
    acc = metrics.min_classifier_accuracy
    _require(0 <= acc <= 1, "metrics.min_classifier_accuracy", acc, "must lie in [0, 1]",
             "metrics.min_classifier_accuracy=0.98")  # fmt: skip
    check_policy(cfg.reliability.on_failure)


def register_generate_configs() -> None:
    """Store the generate schema and every generated group (``register_configs``) in Hydra's
    ConfigStore (idempotent)."""
    from hydra.core.config_store import ConfigStore

    from experiments.config.groups import register_configs

    register_configs()
    ConfigStore.instance().store(name="generate_schema", node=GenerateConfig)
