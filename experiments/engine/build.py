"""Build an experiment's parts (data, model, optimiser, sinks) from the typed run config.

Functions take the nodes of a ``TrainConfig`` (``experiments.config.typed.typed_config``):
dataclass instances, built with or without Hydra (``ModelConf(width=16)``).
"""

from __future__ import annotations

from collections.abc import Mapping
from copy import deepcopy
from pathlib import Path
from typing import Any

import torch
from hydra.utils import instantiate
from torch import nn
from torch.utils.data import DataLoader, Dataset

from experiments.config.groups import ModelConf
from experiments.config.typed import ContextConf, OptimConf, TargetConf
from experiments.data.factory import TaskInfo
from experiments.data.splits import Splits
from experiments.engine.sampler import EpochBatchSampler
from experiments.models import ContextClassifier, ContextSegmenter, TwoStreamSegmenter
from experiments.models import context_channels as two_stream_channels
from experiments.models.deq1d import DEQClassifier1d
from experiments.models.masked_cell import CellPairingClassifier, MaskedCellModel
from experiments.models.sequence import (
    ConvClassifier1d,
    GRUClassifier,
    MLPClassifier,
    StridedConvClassifier1d,
    TokenTransformer,
)
from experiments.studies.pretraining import load_backbone
from implicit_ham.adjoints.modes import Adjoint
from implicit_ham.diagnostics import Sink
from implicit_ham.nn.context import decomposition_of
from implicit_ham.nn.identity import IdentityContext
from implicit_ham.plugins import check_choice
from implicit_ham.solvers.base import FixedPointSolver


def build_datasets(data: TargetConf) -> tuple[Dataset, Dataset, TaskInfo]:
    """(train set, validation set, task) of the data config, instantiated by its ``_target_``
    (a function of ``experiments.data.splits``)."""
    splits = instantiate(data, _partial_=True)()  # its own errors, not Hydra's wrapper
    if not isinstance(splits, Splits):
        raise TypeError(
            f"data config {data!r} built a {type(splits).__name__}; its _target_ must "
            "be a function of experiments.data.splits (or another function returning Splits)"
        )
    return splits.train, splits.val, splits.task


def build_loaders(
    train: Dataset, val: Dataset, batch_size: int, seed: int, *, rank: int = 0, world_size: int = 1
) -> tuple[DataLoader, DataLoader]:
    """Shuffled training batches (an ``EpochBatchSampler``: the order of epoch e depends only
    on (seed, e); this rank's slice of each global batch) and ordered validation batches. Both
    loaders own a generator, so iterating them never draws from torch's global RNG."""
    size = len(train)  # type: ignore[arg-type]
    sampler = EpochBatchSampler(size, batch_size, seed=seed, rank=rank, world_size=world_size)
    return (
        DataLoader(train, batch_sampler=sampler, generator=torch.Generator().manual_seed(seed)),
        DataLoader(
            val, batch_size=batch_size, shuffle=False, generator=torch.Generator().manual_seed(seed)
        ),
    )


def build_context(
    context: ContextConf,
    channels: int,
    solver: FixedPointSolver | None,
    adjoint: Adjoint | None,
) -> nn.Module:
    """Instantiate the context config (``_target_``: ``implicit_ham.make_context``) on
    ``channels`` channels; decompositions get ``solver`` and ``adjoint`` (None: the
    decomposition's defaults), baselines have neither."""
    runtime: dict[str, Any] = {"channels": channels}
    if decomposition_of(context.name) is not None:  # a Hamburger or a HamMixer
        runtime.update(solver=solver, adjoint=adjoint)
    return instantiate(context, _partial_=True)(**runtime)  # objects, not configs


SEGMENTER_ARCHS = ("two_stream", "serial")
SEQUENCE_ARCHS = ("transformer", "cnn1d", "cnn_strided", "mlp", "gru", "deq1d")


def context_channels(task: TaskInfo, model: ModelConf) -> int:
    """Channels of the context module that ``build_model(task, context, model)`` needs."""
    check_choice("model", "arch", model.arch, SEGMENTER_ARCHS + SEQUENCE_ARCHS)
    if task.kind == "segmentation" and model.arch == "two_stream":
        return two_stream_channels(task.in_channels, model.colour_bins, model.position_grid)
    return model.width


def build_model(
    task: TaskInfo,
    context: nn.Module,
    model: ModelConf,
    solver: FixedPointSolver | None = None,
    adjoint: Adjoint | None = None,
) -> nn.Module:
    """A segmenter (``model.arch``) or a classifier (by ``task.kind``) around ``context``,
    which must take ``context_channels(task, model)`` channels (a sequence arch: see
    ``_sequence_network``; ``solver`` and ``adjoint`` are the ``deq1d``'s); in the
    channels-last memory format when ``model.channels_last`` (one thread, the paper-regime
    segmenter's training step at batch 16, 64x64: 30 vs 44 ms with the identity as
    context)."""
    if model.arch in SEQUENCE_ARCHS:
        return _sequence_network(task, context, model, solver, adjoint)
    network = _network(task, context, model)
    if model.channels_last:
        # Module.to takes memory_format at run time; its type stubs do not list it
        network = network.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    return network


def _sequence_network(
    task: TaskInfo,
    context: nn.Module,
    model: ModelConf,
    solver: FixedPointSolver | None,
    adjoint: Adjoint | None,
) -> nn.Module:
    """The public benchmarks' models (``experiments.models.sequence``, ``deq1d``) on a
    classification task with sequence inputs (``task.length`` set). ``transformer`` needs token
    ids (``task.vocab_size``); its ``layers`` mixers are ``context`` and fresh copies of it
    (re-initialised). ``mlp`` / ``cnn_strided`` / ``gru`` (the MNIST-1D package's baselines) and
    ``deq1d`` have no context: they take ``none``."""
    if task.kind != "classification" or task.length is None:
        raise ValueError(
            f"model.arch={model.arch!r} needs a sequence classification task (data=h3_induction, "
            f"h3_associative_recall or mnist1d); this data's task is {task.kind!r} with "
            f"image_size={task.image_size}"
        )
    if model.arch == "transformer":
        if task.vocab_size is None:
            raise ValueError(
                "model.arch=transformer reads token ids; data=mnist1d has real-valued sequences "
                "(use model.arch=cnn1d, cnn_strided, mlp, gru or deq1d)"
            )
        mixers = [context] + [_fresh(context) for _ in range((model.layers or 2) - 1)]
        return TokenTransformer(task.vocab_size, task.length, task.num_classes, mixers,
                                width=model.width, dropout=model.dropout or 0.0)  # fmt: skip
    if task.vocab_size is not None:
        raise ValueError(
            f"model.arch={model.arch!r} reads real-valued sequences (B, C, N); this data has "
            "token ids (use model.arch=transformer)"
        )
    if model.arch == "cnn1d":
        return ConvClassifier1d(task.in_channels, task.num_classes, context, width=model.width)
    if not isinstance(context, IdentityContext):
        raise ValueError(
            f"model.arch={model.arch!r} has no context block; got {type(context).__name__} "
            "(use context=none, or model.arch=cnn1d / transformer)"
        )
    if model.arch == "mlp":
        return MLPClassifier(task.in_channels * task.length, task.num_classes, model.width)
    if model.arch == "gru":
        return GRUClassifier(task.in_channels, task.length, task.num_classes, model.width)
    if model.arch == "cnn_strided":
        return StridedConvClassifier1d(task.in_channels, task.length, task.num_classes,
                                       model.width)  # fmt: skip
    return DEQClassifier1d(task.in_channels, task.num_classes, width=model.width,
                           gain=0.5 if model.gain is None else model.gain, solver=solver,
                           adjoint=adjoint, stabilise=model.stabilise)  # fmt: skip


def _fresh(module: nn.Module) -> nn.Module:
    """A copy of ``module`` with every submodule's parameters drawn again
    (``reset_parameters``), so stacked layers do not start equal."""
    copy = deepcopy(module)
    for sub in copy.modules():
        reset = getattr(sub, "reset_parameters", None)
        if callable(reset):
            reset()
    return copy


def _network(task: TaskInfo, context: nn.Module, model: ModelConf) -> nn.Module:
    check_choice("model", "arch", model.arch, SEGMENTER_ARCHS)
    if task.kind == "masked_cell":  # far-twin canvases; the seed fixes the shared layers
        return MaskedCellModel(context, width=model.width, init_seed=model.init_seed or 0)
    if task.kind == "pairing":  # real vs recombined far-twin canvases, the same per-cell network
        return CellPairingClassifier(context, width=model.width, init_seed=model.init_seed or 0)
    if task.kind != "segmentation":
        return ContextClassifier(task.in_channels, task.num_classes, context, width=model.width)
    if model.arch == "serial":
        segmenter = ContextSegmenter(task.in_channels, task.num_classes, context, width=model.width)
        if model.pretrained is not None:
            load_backbone(segmenter.backbone, model.pretrained)
        if model.freeze_backbone:
            segmenter.freeze_backbone()
        return segmenter
    if (model.pretrained, model.freeze_backbone, model.backbone_lr_scale) != (None, None, None):
        raise ValueError(
            f"model.pretrained / freeze_backbone / backbone_lr_scale apply to arch=serial only, "
            f"not arch={model.arch!r}; set model.arch=serial or leave them unset"
        )
    return TwoStreamSegmenter(
        task.in_channels,
        task.num_classes,
        context,
        width=model.width,
        colour_bins=model.colour_bins,
        position_grid=model.position_grid,
        colour_scale=model.colour_scale,
    )


def build_optimizer(
    optim: OptimConf, model: nn.Module, backbone_lr_scale: float | None = None
) -> torch.optim.Optimizer:
    """Instantiate the partial optimiser config on ``model``'s trainable parameters; with
    ``backbone_lr_scale``, ``model.backbone``'s parameters form a second group whose learning
    rate is the optimiser's times that factor (fine-tuning a pretrained backbone)."""
    factory = instantiate(optim)
    trainable = [p for p in model.parameters() if p.requires_grad]
    if backbone_lr_scale is None:
        return factory(trainable)
    backbone = getattr(model, "backbone", None)
    if not isinstance(backbone, nn.Module):
        raise ValueError(
            f"model.backbone_lr_scale={backbone_lr_scale} needs a model with a backbone; "
            f"{type(model).__name__} has none (use model.arch=serial)"
        )
    if not backbone_lr_scale > 0:
        raise ValueError(f"model.backbone_lr_scale must be > 0, got {backbone_lr_scale!r}")
    own = {id(p) for p in backbone.parameters()}
    groups: list[dict[str, Any]] = [
        {"params": [p for p in trainable if id(p) not in own]},
        {"params": [p for p in trainable if id(p) in own], "lr": optim.lr * backbone_lr_scale},
    ]
    return factory([g for g in groups if g["params"]])


def build_sinks(logger_cfg: TargetConf, directory: Path, config: Mapping[str, Any]) -> list[Sink]:
    """Instantiate the logger config (``_target_``: a function of ``experiments.engine.sinks``)
    for a job in ``directory``; ``config`` is the run's config as plain data
    (``experiments.config.typed.as_container``), which a wandb sink records."""
    return list(instantiate(logger_cfg, _partial_=True)(directory, dict(config)))
