"""The paper regime's machinery (the ``paper_v4`` preset of study v4): same forward value across
the gradient arms of a ham, the poly schedule, the frozen / fine-tuned backbone, the cached
pretraining artefact, the task-loss gradients. The paired interval and verdict are tested in
tests/experiments/reports/test_verdicts.py."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

import implicit_ham as ih
from experiments.config.groups import TrainConfig, register_configs
from experiments.config.typed import typed_config
from experiments.engine.build import (
    build_context,
    build_datasets,
    build_model,
    build_optimizer,
    context_channels,
)
from experiments.engine.schedule import poly_lr_hooks
from experiments.engine.task import Task
from experiments.studies import pretraining
from experiments.studies.pretraining import (
    PretrainConf,
    ensure_pretrained,
    load_backbone,
)
from experiments.studies.task_gradients import task_loss_gradient
from implicit_ham.reliability.guard import StepHooks

CONF = Path(__file__).resolve().parents[3] / "conf"
GRADIENT_ARMS = ("one_step", "one_step_bases", "unroll", "implicit_ridge", "phantom")
TINY = PretrainConf(width=16, images=8, steps=2, batch_size=4)


@pytest.fixture(scope="module")
def artefact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("pretrain") / "backbone.pt"
    ensure_pretrained(path, TINY)
    return path


def _config(arm: str, artefact: Path, *extra: str) -> TrainConfig:
    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(
            "config",
            overrides=[
                "+experiment=paper_v4",
                f"+arm={arm}",
                f"model.pretrained={artefact}",
                "model.width=16",
                "data.train_size=2",
                "data.val_size=2",
                "data.test_size=2",
                *extra,
            ],
        )
    return typed_config(cfg, TrainConfig)


def _model(cfg: TrainConfig) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    train, _, info = build_datasets(cfg.data)
    torch.manual_seed(0)
    solver, adjoint = instantiate(cfg.solver), instantiate(cfg.adjoint)
    context = build_context(cfg.context, context_channels(info, cfg.model), solver, adjoint)
    return build_model(info, context, cfg.model), *train.tensors


@pytest.mark.parametrize("ham", ["nmf", "vq", "cd"])
def test_gradient_arms_of_a_ham_have_the_same_forward_value(ham: str, artefact: Path) -> None:
    values = {}
    for grad in GRADIENT_ARMS:
        model, images, _ = _model(_config(f"{ham}_{grad}", artefact))
        for mode in (True, False):
            model.train(mode)
            torch.manual_seed(1)  # the same random initial bases
            values[grad, mode] = model(images).detach()
    for grad in GRADIENT_ARMS[1:]:
        for mode in (True, False):
            assert torch.equal(values[grad, mode], values["one_step", mode]), (grad, mode)
    # the arms differ in their gradients: the paper's one-step is not BPTT's
    grads = {}
    for grad in ("one_step", "unroll"):
        model, images, masks = _model(_config(f"{ham}_{grad}", artefact))
        torch.manual_seed(1)
        torch.nn.functional.cross_entropy(model(images), masks).backward()
        grads[grad] = model.backbone.layers[0][0].weight.grad.clone()
    assert not torch.allclose(grads["one_step"], grads["unroll"])


def test_poly_schedule_sets_the_closed_form_rate_and_survives_a_checkpoint() -> None:
    weight = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.SGD([{"params": [weight]}, {"params": [], "lr": 0.02}], lr=0.1)
    hooks = poly_lr_hooks(StepHooks(), optimizer, total=10, power=0.9)
    for step in (0, 3, 9):
        hooks.after_backward(step)  # type: ignore[misc]
        assert optimizer.param_groups[0]["lr"] == pytest.approx(0.1 * (1 - step / 10) ** 0.9)
        assert optimizer.param_groups[1]["lr"] == pytest.approx(0.02 * (1 - step / 10) ** 0.9)
    resumed = torch.optim.SGD([{"params": [weight]}, {"params": [], "lr": 0.5}], lr=0.5)
    resumed.load_state_dict(optimizer.state_dict())
    again = poly_lr_hooks(StepHooks(), resumed, total=10, power=0.9)
    again.after_backward(5)  # type: ignore[misc]
    assert resumed.param_groups[0]["lr"] == pytest.approx(0.1 * 0.5**0.9)
    with pytest.raises(ValueError, match="lr_poly_power must be > 0"):
        poly_lr_hooks(StepHooks(), optimizer, total=10, power=0.0)


def test_fine_tuned_backbone_gets_the_scaled_rate_and_the_pretrained_weights(
    artefact: Path,
) -> None:
    cfg = _config("nmf_one_step", artefact)
    model, _, _ = _model(cfg)
    weights = pretraining.read_checkpoint(artefact)["backbone"]
    for name, value in model.backbone.state_dict().items():
        assert torch.equal(value, weights[name]), name
    optimizer = build_optimizer(cfg.optim, model, cfg.model.backbone_lr_scale)
    head, backbone = optimizer.param_groups
    assert head["lr"] == 0.05 and backbone["lr"] == pytest.approx(0.005)
    assert {id(p) for p in backbone["params"]} == {id(p) for p in model.backbone.parameters()}


def test_frozen_backbone_keeps_its_weights_and_statistics_through_training(
    artefact: Path,
) -> None:
    cfg = _config("nmf_one_step", artefact, "model.freeze_backbone=true",
                  "model.backbone_lr_scale=null")  # fmt: skip
    model, images, masks = _model(cfg)
    before = {k: v.clone() for k, v in model.backbone.state_dict().items()}
    optimizer = build_optimizer(cfg.optim, model)
    model.train()
    assert not model.backbone.training and model.context.training
    loss = torch.nn.functional.cross_entropy(model(images), masks)
    loss.backward()
    optimizer.step()
    for name, value in model.backbone.state_dict().items():
        assert torch.equal(value, before[name]), name  # weights and BatchNorm running stats
    assert all(p.grad is None for p in model.backbone.parameters())


def test_pretraining_is_cached_by_config_and_checked_on_load(
    artefact: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def retrain(_conf: PretrainConf) -> dict:
        raise AssertionError("a cached artefact with this config must not be retrained")

    monkeypatch.setattr(pretraining, "pretrain_backbone", retrain)
    assert ensure_pretrained(artefact, TINY)["config"]["steps"] == TINY.steps
    with pytest.raises(ValueError, match="delete it or pass another --out"):
        ensure_pretrained(artefact, PretrainConf(width=16, images=8, steps=3, batch_size=4))
    with pytest.raises(ValueError, match="width 16"):
        load_backbone(ih.IdentityContext(), artefact)
    with pytest.raises(FileNotFoundError, match=r"python -m experiments\.pretrain --out"):
        load_backbone(ih.IdentityContext(), artefact.with_name("absent.pt"))


def test_task_gradient_through_bases_is_bptt_at_one_step_and_the_papers_is_not(
    artefact: Path,
) -> None:
    model, images, masks = _model(_config("nmf_one_step", artefact))
    model = model.double()
    ham = next(m for m in model.modules() if isinstance(m, ih.Decomposition))
    task = Task("segmentation", 11, -100)

    def grad(adjoint: ih.plugins.Adjoint, through: bool) -> torch.Tensor:
        return task_loss_gradient(model, ham, images.double(), masks, task, adjoint=adjoint,
                                  through_bases=through, steps=1)  # fmt: skip

    bptt, through = grad(ih.Unroll(), False), grad(ih.OneStep(), True)
    paper = grad(ih.OneStep(), False)
    cosine = float((paper * bptt).sum() / (paper.norm() * bptt.norm()))
    assert torch.allclose(through, bptt, rtol=1e-9, atol=1e-12)
    assert math.isfinite(cosine) and cosine < 0.99
    assert ham.adjoint.__class__.__name__ == "OneStep" and not ham.grad_through_bases  # restored
