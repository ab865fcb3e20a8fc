"""The Jacobian penalty as a training option (``penalty=jacobian``): the training loss gains
``weight * ih.jacobian_penalty`` at the implicit layer's fixed point on every ``every``-th step
and only there; evaluation never sees it; the config is generated from the signature."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from torch import nn

import implicit_ham as ih
from experiments.config.groups import TrainConfig, register_configs
from experiments.config.typed import typed_config
from experiments.engine.state import TrainState
from experiments.engine.task import Task, evaluate
from experiments.engine.trainer import Trainer
from experiments.models.jacobian_penalty import JacobianPenalty
from implicit_ham.reliability.guard import GuardedStep

CONF = Path(__file__).resolve().parents[3] / "conf"
WEIGHT, EVERY = 0.7, 3


def _model(adjoint: ih.plugins.Adjoint) -> nn.Sequential:
    """conv -> ReLU -> NMF (an implicit layer, random init) -> pooled linear head."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1),
        nn.ReLU(),
        ih.NMF(rank=2, steps=4, adjoint=adjoint),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(4, 3),
    ).double()


def _data(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(100 + step)
    x = torch.randn(2, 1, 5, 5, generator=gen, dtype=torch.float64)
    return x, torch.randint(0, 3, (2,), generator=gen)


def _reference(model: nn.Sequential, x: torch.Tensor, y: torch.Tensor, step: int) -> torch.Tensor:
    """The loss by hand: cross-entropy, plus (on the due steps) WEIGHT times a direct
    ih.jacobian_penalty call at the NMF layer's solution, from the same random state."""
    logits = model(x)
    loss = F.cross_entropy(logits, y)
    if step % EVERY:
        return loss
    nmf = model[2]
    features = model[1](model[0](x))
    with torch.random.fork_rng():
        problem = nmf.implicit_problem(features)
    penalty = ih.jacobian_penalty(problem.f, nmf.last_solution.value, *problem.args)
    return loss + WEIGHT * penalty


@pytest.mark.filterwarnings("ignore::implicit_ham.errors.NotFixedPointWarning")
@pytest.mark.parametrize("adjoint", [ih.OneStep(), ih.Implicit(linear_solver="dense")], ids=repr)
def test_the_loss_gains_the_penalty_on_the_due_steps_only(adjoint: ih.plugins.Adjoint) -> None:
    model = _model(adjoint)
    penalty = JacobianPenalty(weight=WEIGHT, every=EVERY).attach(model)
    task = Task("classification", 3, penalty=penalty)
    due = []
    for step in range(7):
        x, y = _data(step)
        penalty.step = step
        torch.manual_seed(step)
        loss = task.loss(model(x), y)
        grads = torch.autograd.grad(loss, list(model.parameters()), allow_unused=True)
        torch.manual_seed(step)
        expected = _reference(model, x, y, step)
        ref = torch.autograd.grad(expected, list(model.parameters()), allow_unused=True)
        assert torch.allclose(loss, expected, rtol=1e-12, atol=0), step
        for g, r in zip(grads, ref, strict=True):
            assert (g is None) == (r is None)
            if g is not None:
                assert torch.allclose(g, r, rtol=1e-10, atol=1e-14)
        torch.manual_seed(step)
        gain = float((loss - F.cross_entropy(model(x), y)).detach())
        due.append(gain > 0 if step % EVERY == 0 else gain == 0.0)
    assert due == [True] * 7  # due steps: strictly larger; others: exactly the cross-entropy
    assert penalty.last is not None and float(penalty.last) > 0


def test_the_trainer_sets_the_step_and_evaluation_has_no_penalty() -> None:
    """Through the engine's loop (GuardedStep, lr 0 so the model stays put): the returned
    losses differ from an unpenalised run exactly on steps 0, 3, 6."""
    batches = [_data(step) for step in range(7)]

    def losses(penalty: JacobianPenalty | None) -> list[float]:
        model = _model(ih.OneStep())
        task = Task("classification", 3, penalty=None if penalty is None else penalty.attach(model))
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        seen: list[float] = []
        step_fn = GuardedStep(model, task, opt)

        def record(inputs: torch.Tensor, target: torch.Tensor, step: int) -> torch.Tensor | None:
            torch.manual_seed(step)
            out = step_fn(inputs, target, step)
            seen.append(float(out))
            return out

        Trainer(model, task, record, device=torch.device("cpu")).train_epoch(batches, TrainState())
        torch.manual_seed(9)  # the same random bases for both evaluations
        metrics = evaluate(model, batches[:2], task, device=torch.device("cpu"))
        torch.manual_seed(9)
        plain = evaluate(model, batches[:2], Task("classification", 3),
                         device=torch.device("cpu"))
        assert metrics["val/loss"] == plain["val/loss"]
        return seen

    with_penalty = losses(JacobianPenalty(weight=WEIGHT, every=EVERY))
    without = losses(None)
    differs = [a != b for a, b in zip(with_penalty, without, strict=True)]
    assert differs == [step % EVERY == 0 for step in range(7)]
    assert all(a > b for a, b, d in zip(with_penalty, without, differs, strict=True) if d)


def test_the_config_option_is_generated_from_the_signature() -> None:
    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        default = typed_config(compose("config"), TrainConfig)
        chosen = typed_config(
            compose("config", overrides=["penalty=jacobian", "penalty.weight=0.1",
                                         "penalty.every=2"]),
            TrainConfig,
        )
    assert default.penalty is None  # off by default (and old checkpoints' configs still match)
    built = instantiate(chosen.penalty)
    assert isinstance(built, JacobianPenalty)
    assert (built.weight, built.every, built.samples) == (0.1, 2, 1)
    assert set(vars(type(chosen.penalty))["__dataclass_fields__"]) == {
        "_target_", "weight", "every", "samples"
    }


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"weight": -1.0}, "weight must be a number >= 0"),
        ({"weight": 1.0, "every": 0}, "every"),
        ({"weight": 1.0, "samples": 0}, "samples"),
    ],
)
def test_bad_options_are_refused(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        JacobianPenalty(**kwargs)


def test_a_model_without_an_implicit_layer_is_refused() -> None:
    with pytest.raises(ValueError, match="no implicit layer"):
        JacobianPenalty(weight=1.0).attach(nn.Linear(2, 2))
