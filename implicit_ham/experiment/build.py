"""Build an experiment's parts (data, model, optimiser, sinks) from a resolved config.

Functions take plain mappings (a resolved ``DictConfig`` converted to a dict, or a dict written
by hand), so they work with or without Hydra.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from hydra.utils import instantiate
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from ..adjoints import Adjoint
from ..data import LegendSegDataset, make_dataset, task_of
from ..data.factory import TaskInfo
from ..decompositions.registry import DECOMPOSITIONS
from ..models import ContextClassifier, ContextSegmenter, TwoStreamSegmenter
from ..models import context_channels as two_stream_channels
from ..modules.context import make_context
from ..solvers import Solver
from ..tracking import CSVSink, JSONLSink, Sink, WandbSink
from ..training.sampler import EpochBatchSampler
from ..validation import check_choice
from .schema import ModelConf

VAL_SPLITS = {"legend_seg": "val", "digits": "val", "cifar10": "test", "voc2012": "val"}


def build_datasets(data: Mapping[str, Any]) -> tuple[Dataset, Dataset, TaskInfo]:
    """(train set, validation set, task) of the data config (see ``schema`` data options)."""
    options = {k: v for k, v in data.items() if k != "name"}
    name = data["name"]
    if name == "legend_seg":
        shared = {k: options[k] for k in ("image_size", "num_classes", "seed")}
        train = LegendSegDataset(options["train_size"], split="train", **shared)
        val = LegendSegDataset(options["val_size"], split="val", **shared)
        return (
            TensorDataset(*train.materialize()),
            TensorDataset(*val.materialize()),
            task_of(name, num_classes=shared["num_classes"]),
        )
    root = options.pop("root", None)
    train = make_dataset(name, root=root, split="train", **options)
    val = make_dataset(name, root=root, split=VAL_SPLITS[name], **options)
    return train, val, task_of(name, **options)


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
    context: Mapping[str, Any], channels: int, solver: Solver, adjoint: Adjoint
) -> nn.Module:
    """The context module named ``context["name"]`` on ``channels`` channels; decompositions
    get ``solver`` and ``adjoint``, baselines ignore them."""
    options = {k: v for k, v in context.items() if k != "name"}
    name = context["name"]
    if name in DECOMPOSITIONS.names():
        return make_context(name, channels, solver=solver, adjoint=adjoint, **options)
    return make_context(name, channels, **options)


SEGMENTER_ARCHS = ("two_stream", "serial")


def _model_conf(model: Mapping[str, Any]) -> ModelConf:
    """The model config with its defaults filled in; unknown keys or arch raise."""
    try:
        conf = ModelConf(**dict(model))
    except TypeError as err:
        raise ValueError(
            f"model config {dict(model)!r}: {err}; valid keys: "
            f"{', '.join(f.name for f in dataclasses.fields(ModelConf))}"
        ) from err
    check_choice("model", "arch", conf.arch, SEGMENTER_ARCHS)
    return conf


def context_channels(task: TaskInfo, model: Mapping[str, Any]) -> int:
    """Channels of the context module that ``build_model(task, context, model)`` needs."""
    conf = _model_conf(model)
    if task.kind == "segmentation" and conf.arch == "two_stream":
        return two_stream_channels(task.in_channels, conf.colour_bins, conf.position_grid)
    return conf.width


def build_model(task: TaskInfo, context: nn.Module, model: Mapping[str, Any]) -> nn.Module:
    """A segmenter (``model["arch"]``) or a classifier (by ``task.kind``) around ``context``,
    which must take ``context_channels(task, model)`` channels."""
    conf = _model_conf(model)
    if task.kind != "segmentation":
        return ContextClassifier(task.in_channels, task.num_classes, context, width=conf.width)
    if conf.arch == "serial":
        return ContextSegmenter(task.in_channels, task.num_classes, context, width=conf.width)
    return TwoStreamSegmenter(
        task.in_channels,
        task.num_classes,
        context,
        width=conf.width,
        colour_bins=conf.colour_bins,
        position_grid=conf.position_grid,
        colour_scale=conf.colour_scale,
    )


def build_optimizer(optim: Mapping[str, Any], model: nn.Module) -> torch.optim.Optimizer:
    """Instantiate the partial optimiser config on ``model``'s parameters."""
    return instantiate(dict(optim))(model.parameters())


def build_sinks(
    logger_cfg: Mapping[str, Any], directory: Path, config: Mapping[str, Any]
) -> list[Sink]:
    """Metric sinks: files (JSONL + CSV) unless ``kind == "none"``, plus wandb for ``"wandb"``
    (offline unless ``WANDB_API_KEY`` is set or ``mode`` says otherwise)."""
    sinks: list[Sink] = []
    kind = logger_cfg["kind"]
    if kind in ("files", "wandb"):
        sinks += [JSONLSink(directory), CSVSink(directory)]
    if kind == "wandb":
        mode = logger_cfg.get("mode") or (
            "online" if os.environ.get("WANDB_API_KEY") else "offline"
        )
        sinks.append(
            WandbSink(
                logger_cfg["project"],
                group=logger_cfg.get("group"),
                tags=list(logger_cfg.get("tags") or []),
                config=dict(config),
                mode=mode,
                dir=str(directory),
            )
        )
    return sinks
