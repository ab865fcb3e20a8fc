"""The no-training studies run end to end on a tiny config and report sane numbers."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from experiments.config.groups import TrainConfig, register_configs
from experiments.config.typed import typed_config
from experiments.engine.build import (
    build_context,
    build_datasets,
    build_loaders,
    build_model,
    context_channels,
)
from experiments.engine.checkpoint import write_checkpoint
from experiments.engine.run import seed_everything
from experiments.engine.task import Task, evaluate
from experiments.studies.model_studies import run_convergence, run_grad_study

CONF = Path(__file__).resolve().parents[3] / "conf"
HAM = ["context.rank=3", "context.steps=3", "context.eval_steps=3"]
TINY = [
    "data.val_size=4",
    "data.train_size=4",
    "data.image_size=32",
    "data.num_classes=3",
    "model.width=16",
    "study.samples=1",
    "study.ks=[1,4]",
    "study.reference_steps=40",
    "study.max_steps=12",
]


def _cfg(*overrides: str) -> TrainConfig:
    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=[*TINY, *overrides])
    return typed_config(cfg, TrainConfig)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_grad_study_reports_exact_unroll_and_conditioning(tmp_path: Path) -> None:
    results = run_grad_study(_cfg("context=cd", *HAM), tmp_path)
    rows = {row["adjoint"]: row for row in results["fidelity"]}
    assert rows["unroll"]["reference"] is True and rows["unroll"]["cosine"] == pytest.approx(1)
    assert set(rows) >= {"one_step", "implicit", "truncated(k=2)"}
    assert all(-1.0 <= row["cosine"] <= 1.0 + 1e-9 for row in rows.values())
    assert {row["K"] for row in results["grad_vs_k"]} == {1, 4}
    by_mode = {(row["adjoint"], row["K"]): row for row in results["grad_vs_k"]}
    assert by_mode[("unroll", 4)]["cosine_same_k"] == pytest.approx(1.0)
    assert by_mode[("one_step", 1)]["cosine_same_k"] == pytest.approx(1.0)  # K = 1: the same map
    assert by_mode[("one_step", 4)]["cosine_same_k"] < 1.0 - 1e-6
    assert [row["point"] for row in results["conditioning"]] == ["K steps", "converged"]
    assert all(math.isfinite(row["spectral_radius"]) for row in results["conditioning"])
    assert (tmp_path / "grad_vs_k.png").exists() and (tmp_path / "results.json").exists()


def test_convergence_study_compares_three_solvers(tmp_path: Path) -> None:
    results = run_convergence(_cfg("context=vq", *HAM), tmp_path)
    assert [row["solver"] for row in results["convergence"]] == [
        "fixed_point",
        "anderson",
        "broyden",
    ]
    assert all(row["steps"] <= 12 for row in results["convergence"])
    assert (tmp_path / "residuals.png").exists()


def test_study_of_a_model_without_decomposition_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no decomposition layer"):
        run_convergence(_cfg("context=sdpa_attention"), tmp_path)


def test_convergence_study_evaluates_a_checkpoint_under_other_solvers(tmp_path: Path) -> None:
    """The row at the trained K must equal a plain evaluation of the same weights (same seed,
    so the same random initial bases); the other rows use the other solvers."""
    cfg = _cfg("context=nmf", *HAM)
    torch.manual_seed(0)
    _, val_set, info = build_datasets(cfg.data)
    model = _model(cfg, info)
    checkpoint = tmp_path / "model.pt"
    write_checkpoint(checkpoint, {"model": model.state_dict()})  # as experiments.train does
    results = run_convergence(dataclasses.replace(cfg, checkpoint=str(checkpoint)), tmp_path)
    rows = {row["solver"]: row for row in results["eval_solvers"]}
    assert set(rows) == {
        *(f"fixed_point K={k}" for k in (1, 3, 6, 12, 50)),
        "anderson K<=50 tol=1e-4",
    }
    _, loader = build_loaders(val_set, val_set, cfg.batch_size, cfg.seed)
    seed_everything(cfg.seed)  # after building the loader, as the study does
    task = Task(info.kind, info.num_classes, info.ignore_index)
    with torch.no_grad():
        expected = evaluate(model.eval(), loader, task, device=torch.device("cpu"))
    assert rows["fixed_point K=3"]["val/loss"] == pytest.approx(expected["val/loss"], rel=1e-6)
    assert rows["fixed_point K=50"]["final_rel_residual"] < rows["fixed_point K=1"][
        "final_rel_residual"
    ]
    assert len(results["traces"]["fixed_point"]["rel_residual"]) == 12


def _model(cfg: TrainConfig, info) -> torch.nn.Module:
    solver = instantiate(cfg.solver)  # the config's solver (the library default has a tol)
    context = build_context(cfg.context, context_channels(info, cfg.model), solver, None)
    return build_model(info, context, cfg.model)
