"""``run_training``: the whole training job of ``experiments.train``, from a resolved config."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from hydra.utils import instantiate
from torch import nn

from ..diagnostics import DiagnosticsCallback
from ..diagnostics.gradient_norms import find_implicit_layers
from ..training import StepHooks, Task, fit
from .build import (
    build_context,
    build_datasets,
    build_loaders,
    build_model,
    build_optimizer,
    build_sinks,
)
from .results import write_results

logger = logging.getLogger(__name__)


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (CPU and any accelerator)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def run_training(cfg: Mapping[str, Any], output_dir: str | Path) -> dict[str, Any]:
    """Train and evaluate the configured model; write ``results.json`` and ``checkpoint.pt``.

    Args:
        cfg: the resolved config (see ``schema.TrainConfig``) as a plain mapping.
        output_dir: the job's directory.

    Returns:
        The results: ``config``, final ``metrics``, ``parameters``, ``train_time_s``, and the
        last forward solve statistics of each implicit layer (``solver``).
    """
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    if cfg.get("threads"):
        torch.set_num_threads(int(cfg["threads"]))
    seed_everything(int(cfg["seed"]))
    device = torch.device(cfg["device"])
    train_set, val_set, info = build_datasets(cfg["data"])
    train_loader, val_loader = build_loaders(
        train_set, val_set, int(cfg["batch_size"]), int(cfg["seed"])
    )
    solver, adjoint = instantiate(dict(cfg["solver"])), instantiate(dict(cfg["adjoint"]))
    context = build_context(cfg["context"], cfg["model"]["width"], solver, adjoint)
    model = build_model(info, context, cfg["model"]["width"]).to(device)
    optimizer = build_optimizer(cfg["optim"], model)
    sinks = build_sinks(cfg["logger"], output_dir, cfg)
    hooks, callback = _diagnostics(cfg["diagnostics"], model, sinks, optimizer)
    task = Task(
        info.kind, info.num_classes, info.ignore_index if info.ignore_index is not None else -100
    )
    start = time.perf_counter()
    try:
        metrics = fit(
            model,
            train_loader,
            val_loader,
            task,
            optimizer,
            epochs=int(cfg["epochs"]),
            device=device,
            hooks=hooks,
            sinks=sinks,
            show_progress=bool(cfg.get("progress", True)),
            log_every=int(cfg.get("log_every", 10)),
        )
    finally:
        if callback is not None:
            callback.close()
        for sink in sinks:
            sink.close()
    results = {
        "status": "ok",
        "config": dict(cfg),
        "metrics": metrics,
        "parameters": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "train_time_s": time.perf_counter() - start,
        "solver": _solver_summaries(model),
    }
    torch.save(
        {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "config": dict(cfg)},
        output_dir / "checkpoint.pt",
    )
    write_results(output_dir, results)
    return results


def _diagnostics(
    diag: Mapping[str, Any], model: nn.Module, sinks: list, optimizer: torch.optim.Optimizer
) -> tuple[StepHooks, DiagnosticsCallback | None]:
    if not diag.get("enabled", True) or not sinks:
        return StepHooks(), None
    callback = DiagnosticsCallback(
        model,
        sinks,
        every=int(diag["every"]),
        optimizer=optimizer,
        layer_hooks=bool(diag.get("layer_hooks", True)),
        conditioning_every=diag.get("conditioning_every"),
    )
    return StepHooks(after_backward=callback.on_backward), callback


def _solver_summaries(model: nn.Module) -> dict[str, Any]:
    out = {}
    for name, layer in find_implicit_layers(model).items():
        solution = getattr(layer, "last_solution", None)
        if solution is not None:
            out[name] = solution.stats.summary()
    return out
