"""Gradient-norm clipping (``clip_grad_norm``): the hook rescales the gradients to the stated joint
norm (checked against the norm computed by hand), keeps their direction, and the training step
of ``run_training`` applies it."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch import nn

from experiments.engine.clipping import clip_grad_hooks
from implicit_ham.reliability.guard import StepHooks


def _model_with_grads(scale: float) -> tuple[nn.Module, list[torch.Tensor]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2)).double()
    for p in model.parameters():
        p.grad = scale * torch.randn_like(p)
    return model, [p.grad.clone() for p in model.parameters()]  # type: ignore[union-attr]


def test_the_hook_clips_the_joint_norm_and_keeps_the_direction() -> None:
    model, before = _model_with_grads(10.0)
    norm = math.sqrt(sum(float((g**2).sum()) for g in before))
    calls: list[int] = []
    hooks = clip_grad_hooks(StepHooks(after_backward=calls.append), model, max_norm=1.0)
    assert hooks.after_backward is not None
    hooks.after_backward(7)
    after = [p.grad for p in model.parameters()]
    assert calls == [7]  # the existing hook still runs
    assert math.sqrt(sum(float((g**2).sum()) for g in after)) == pytest.approx(1.0, rel=1e-6)
    for g0, g1 in zip(before, after, strict=True):
        torch.testing.assert_close(g1, g0 / norm, rtol=1e-5, atol=1e-12)


def test_gradients_below_the_limit_are_unchanged_and_a_bad_limit_is_refused() -> None:
    model, before = _model_with_grads(1e-3)
    hooks = clip_grad_hooks(StepHooks(), model, max_norm=1.0)
    assert hooks.after_backward is not None
    hooks.after_backward(0)
    for g0, p in zip(before, model.parameters(), strict=True):
        torch.testing.assert_close(p.grad, g0)
    with pytest.raises(ValueError, match="clip_grad_norm must be > 0"):
        clip_grad_hooks(StepHooks(), model, max_norm=0.0)


def test_run_training_applies_the_clip(tmp_path: Path) -> None:
    from hydra import compose, initialize_config_dir

    from experiments.config.groups import TrainConfig, register_configs
    from experiments.config.typed import typed_config
    from experiments.engine.checkpoint import read_checkpoint
    from experiments.engine.run import run_training

    conf = Path(__file__).resolve().parents[3] / "conf"
    register_configs()
    base = ["context=none", "epochs=1", "progress=false", "threads=1", "data.train_size=8",
            "data.val_size=4", "batch_size=4", "diagnostics=off", "optim=sgd",
            "optim.lr=1.0"]  # fmt: skip
    weights = {}
    for name, extra in (("free", []), ("clipped", ["clip_grad_norm=1e-6"]),
                        ("loose", ["clip_grad_norm=1e9"])):  # fmt: skip
        with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
            cfg = typed_config(compose("config", overrides=base + extra), TrainConfig)
        assert run_training(cfg, tmp_path / name)["status"] == "ok"
        weights[name] = read_checkpoint(tmp_path / name / "checkpoint.pt")["model"]
    floats = [k for k, v in weights["free"].items() if v.is_floating_point()]
    # a limit far above the gradients' norm changes nothing, bit for bit; a tiny one changes the run
    assert all(torch.equal(weights["loose"][k], weights["free"][k]) for k in floats)
    moved = max(float((weights["clipped"][k] - weights["free"][k]).abs().max()) for k in floats)
    assert moved > 1e-4
