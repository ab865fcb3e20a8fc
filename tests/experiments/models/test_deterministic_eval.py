"""Deterministic evaluation in the experiments: a segmentation checkpoint with a Hamburger
context, evaluated twice under different global seeds on a few digit_seg canvases (scikit-learn's
embedded digits), scores the same mIoU with ``eval_init="fixed"`` (the experiments' default in
conf/context) and a different one with the paper's ``"random"``."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import implicit_ham as ih
from experiments.config.groups import register_configs
from experiments.data.digit_canvas import digit_canvases
from experiments.engine.build import build_context
from experiments.engine.task import Task, evaluate
from experiments.models import ContextSegmenter
from implicit_ham.nn.context import make_context

CONF = Path(__file__).resolve().parents[3] / "conf"
HAMS = ["cd", "cd_ridge", "nmf", "nmf_normalized", "nmf_ridge", "svd", "vq"]
TASK = Task("segmentation", 11)


def _model(eval_init: str) -> ContextSegmenter:
    return ContextSegmenter(1, 11, make_context("nmf", 16, rank=4, eval_init=eval_init), width=16)


@pytest.fixture(scope="module")
def checkpoint() -> bytes:
    """A briefly trained model's state dict (trained with random bases, as the experiments
    train; a few steps, so that its predictions depend on the context)."""
    torch.manual_seed(0)
    model = _model("random")
    images, masks = digit_canvases(4, split="train")
    optimiser = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(4):
        optimiser.zero_grad()
        TASK.loss(model(images), masks).backward()
        optimiser.step()
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    return buffer.getvalue()


def _scores(checkpoint: bytes, eval_init: str, seeds: tuple[int, ...]) -> list[dict[str, float]]:
    images, masks = digit_canvases(4, split="val")
    batches = [(images[:2], masks[:2]), (images[2:], masks[2:])]
    scores = []
    for seed in seeds:
        model = _model(eval_init)
        model.load_state_dict(torch.load(io.BytesIO(checkpoint)))
        torch.manual_seed(seed)
        scores.append(evaluate(model, batches, TASK, device=torch.device("cpu")))
    return scores


def test_fixed_evaluation_scores_the_same_under_any_seed_and_random_does_not(
    checkpoint: bytes,
) -> None:
    fixed = _scores(checkpoint, "fixed", (1, 2))
    assert fixed[0] == fixed[1]  # every metric, exactly
    random = _scores(checkpoint, "random", (1, 2))
    assert random[0]["val/miou"] != random[1]["val/miou"]


@pytest.mark.parametrize("name", HAMS)
def test_the_experiments_evaluate_every_ham_with_fixed_bases(name: str) -> None:
    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=[f"context={name}"])
    assert cfg.context.eval_init == "fixed"
    block = build_context(
        OmegaConf.to_object(cfg.context), 16, ih.FixedPointIteration(), ih.OneStep()
    )
    assert block.ham.init_mode == "random" and block.ham.eval_init_mode == "fixed"
    assert hasattr(block.ham, "fixed_bases")
