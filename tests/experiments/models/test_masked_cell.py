"""The masked-cell model of far-twin canvases: every layer but the context block is per cell
(with context "none" a change in one cell moves no other cell's output), arms share their
initial weights by seed, the task's loss reads only the masked cell, and a tiny job trains
through the engine (``run_training``) with its own loss. The pairing classifier built on the
same per-cell network: without context its score is a sum over cells (it cannot read the
pairing), and a tiny job through the engine reports the balanced accuracy of its final model."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from experiments.config.groups import TrainConfig, register_configs
from experiments.config.typed import typed_config
from experiments.data.far_twins import (
    FarTwinsDataset,
    mask_right_cell,
    masked_cell_loss,
    right_cell,
)
from experiments.data.splits import far_twins_pairing
from experiments.engine.run import run_training
from experiments.models.masked_cell import CellPairingClassifier, MaskedCellModel
from implicit_ham import make_context

CONF = Path(__file__).resolve().parents[3] / "conf"


def _model(context: str, seed: int = 0, width: int = 16) -> MaskedCellModel:
    torch.manual_seed(100 + seed)  # the context module's own draws differ from the shared ones
    return MaskedCellModel(make_context(context, width), width=width, init_seed=seed)


def _changed_cells(model: MaskedCellModel) -> torch.Tensor:
    """(4, 4) bool: which output cells move when only input cell (1, 0) changes."""
    torch.manual_seed(3)
    x = torch.rand(2, 1, 32, 32)
    y = x.clone()
    y[:, :, 8:16, 0:8] = torch.rand(2, 1, 8, 8)  # cell (row 1, column 0): the left digit's
    with torch.no_grad():
        diff = (model.cells(x) - model.cells(y)).abs().amax((0, 1))
    return diff > 1e-6


def test_without_context_a_cell_changes_only_its_own_output() -> None:
    changed = _changed_cells(_model("none"))
    expected = torch.zeros(4, 4, dtype=torch.bool)
    expected[1, 0] = True
    assert torch.equal(changed, expected)


def test_self_attention_carries_a_cell_to_the_others() -> None:
    changed = _changed_cells(_model("self_attention"))
    assert bool(changed[1, 3])  # the right digit's cell sees the left digit
    assert int(changed.sum()) == 16


def test_arms_of_one_seed_share_their_initial_weights() -> None:
    none, attention = _model("none", seed=4), _model("self_attention", seed=4)
    other = _model("none", seed=5)
    shared = [n for n, _ in none.named_parameters() if not n.startswith("gate")]
    assert shared
    a, b, c = (dict(m.named_parameters()) for m in (none, attention, other))
    for name in shared:
        assert torch.equal(a[name], b[name]), name
    assert not torch.equal(a["embed.weight"], c["embed.weight"])


def test_masked_cell_loss_reads_only_the_right_digit_cell() -> None:
    torch.manual_seed(0)
    target = torch.rand(3, 1, 32, 32)
    prediction = target + 5.0  # everywhere wrong ...
    delta = torch.randn(3, 8, 8)
    prediction[:, 0, 8:16, 24:32] = target[:, 0, 8:16, 24:32] + delta  # ... but the cell
    expected = sum(float((delta[i] ** 2).sum()) for i in range(3)) / 3
    assert float(masked_cell_loss(prediction, target)) == pytest.approx(expected, rel=1e-6)


def test_masking_blanks_exactly_the_right_digit() -> None:
    canvases = FarTwinsDataset("val", 8, seed=0).canvases
    masked = mask_right_cell(canvases)
    assert float(right_cell(masked).abs().sum()) == 0.0
    assert float(right_cell(canvases).abs().sum()) > 0.0
    keep = torch.ones(32, 32, dtype=torch.bool)
    keep[8:16, 24:32] = False
    assert torch.equal(masked[..., keep], canvases[..., keep])


def _tiny(*overrides: str, preset: str = "generation_v3") -> TrainConfig:
    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(
            "config",
            overrides=[
                f"+experiment={preset}",
                "epochs=2",
                "data.train_size=64",
                "data.val_size=32",
                "batch_size=32",
                "model.width=8",
                *overrides,
            ],
        )
    return typed_config(cfg, TrainConfig)


def test_a_tiny_job_trains_through_the_engine_and_resumes(tmp_path: Path) -> None:
    threads = torch.get_num_threads()
    try:
        cfg = _tiny("+arm=nmf_one_step", "context.rank=2", "context.steps=2",
                    "context.eval_steps=2")  # fmt: skip
        results = run_training(cfg, tmp_path / "job")
        again = run_training(cfg, tmp_path / "job")  # finished: returned, not retrained
    finally:
        torch.set_num_threads(threads)
    assert results["status"] == "ok"
    metrics = results["metrics"]
    assert set(k for k in metrics if k.startswith("val/")) == {"val/loss"}  # no confusion matrix
    assert math.isfinite(metrics["val/loss"]) and metrics["val/loss"] > 0
    assert again["metrics"] == metrics
    state = torch.load(tmp_path / "job" / "checkpoint.pt", weights_only=False)
    model_state = state.get("model", state)
    assert any(k.endswith("gate.gamma") for k in model_state)


def test_a_canvas_output_does_not_depend_on_its_batch() -> None:
    """No batch statistics (the Hamburger's BatchNorm is stripped): in training mode the first
    canvas's prediction stays the same when the rest of its batch changes (the NMF's random
    initial bases are drawn alike: same seed, same batch size)."""
    torch.manual_seed(0)
    model = MaskedCellModel(make_context("nmf", 16, rank=4, steps=3, eval_steps=3), width=16)
    x = torch.rand(6, 1, 32, 32)
    other = x.clone()
    other[1:] = torch.rand(5, 1, 32, 32)
    model.train()
    with torch.no_grad():
        torch.manual_seed(1)
        first = model(x)[:1]
        torch.manual_seed(1)
        second = model(other)[:1]
    torch.testing.assert_close(first, second, rtol=1e-4, atol=1e-5)


def _swap_right_digits(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Two canvases (1, 1, 32, 32) with their right halves exchanged."""
    return (torch.cat([a[..., :16], b[..., 16:]], -1), torch.cat([b[..., :16], a[..., 16:]], -1))


@pytest.mark.parametrize("context", ["none", "self_attention"])
def test_without_context_the_pairing_score_is_a_sum_over_cells(context: str) -> None:
    """score(a) + score(b) == score(a's left, b's right) + score(b's left, a's right) holds for
    any sum of per-cell scores; the self-attention model breaks it (it reads both digits). At
    its initial weights the attention is nearly uniform, a mean over cells, which is linear and
    keeps the sum: its weights are scaled by 10 to make it attend."""
    torch.manual_seed(7)
    model = CellPairingClassifier(make_context(context, 16), width=16, init_seed=2).eval()
    with torch.no_grad():
        for weight in model.gate.context.parameters():
            weight.mul_(10.0)
    canvases = FarTwinsDataset("val", 2, seed=0).canvases
    a, b = canvases[:1], canvases[1:]
    ab, ba = _swap_right_digits(a, b)
    with torch.no_grad():
        gap = (model(a) + model(b) - model(ab) - model(ba)).abs().max()
        assert model(a).shape == (1, 2)
    if context == "none":
        assert float(gap) < 1e-5
    else:
        assert float(gap) > 1e-3


def test_pairing_arms_of_one_seed_share_their_initial_weights() -> None:
    torch.manual_seed(100)
    none = CellPairingClassifier(make_context("none", 8), width=8, init_seed=3)
    attention = CellPairingClassifier(make_context("self_attention", 8), width=8, init_seed=3)
    b = dict(attention.named_parameters())
    for name, value in none.named_parameters():
        if not name.startswith("gate"):
            assert torch.equal(value, b[name]), name
    assert none.head[-1].out_channels == 2


def test_a_tiny_pairing_job_reports_the_balanced_accuracy_of_its_model(tmp_path: Path) -> None:
    sizes = {"train_size": 64, "val_size": 32, "seed": 1}
    threads = torch.get_num_threads()
    try:
        cfg = _tiny("+arm=none", "data.seed=1", "model.init_seed=1",
                    preset="generation_v3_pairing")  # fmt: skip
        results = run_training(cfg, tmp_path / "job")
    finally:
        torch.set_num_threads(threads)
    assert results["status"] == "ok"
    state = torch.load(tmp_path / "job" / "checkpoint.pt", weights_only=False)
    model = CellPairingClassifier(make_context("none", 8), width=8, init_seed=1)
    model.load_state_dict(state.get("model", state))
    canvases, labels = far_twins_pairing(**sizes).val.tensors
    with torch.no_grad():
        predicted = model.eval()(canvases).argmax(1)
    recalls = [float((predicted[labels == c] == c).float().mean()) for c in (0, 1)]
    assert results["metrics"]["val/accuracy"] == pytest.approx(sum(recalls) / 2, abs=1e-12)
