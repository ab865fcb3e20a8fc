"""The public benchmarks' sequence models: shapes, a gradient reaching every parameter, the
mixer seeing every position, and the engine's wiring (data + arch + context + adjoint)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import implicit_ham as ih
from experiments.config.groups import ModelConf
from experiments.data.factory import TaskInfo
from experiments.engine.build import build_model
from experiments.engine.run import run_training
from experiments.models.deq1d import DEQClassifier1d
from experiments.models.sequence import (
    ConvClassifier1d,
    GRUClassifier,
    MLPClassifier,
    StridedConvClassifier1d,
    TokenTransformer,
)
from experiments.studies.job_row import compose_overrides

TOKENS = TaskInfo("classification", 12, 1, None, None, length=9, vocab_size=12)
SERIES = TaskInfo("classification", 10, 1, None, None, length=16)


def _all_grads(model: nn.Module, inputs: torch.Tensor) -> None:
    model(inputs).square().sum().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum()]
    assert not missing, f"no gradient reaches {missing}"


@pytest.mark.parametrize("name", ["sdpa_mixer", "linear_attention_mixer", "nmf_mixer", "cd_mixer"])
def test_transformer_shapes_and_gradients(name: str) -> None:
    torch.manual_seed(0)
    options = {} if "attention" in name or "sdpa" in name else {"rank": 3}
    context = ih.make_context(name, 16, **options)
    model = build_model(TOKENS, context, ModelConf(arch="transformer", width=16))
    assert isinstance(model, TokenTransformer) and len(model.mixers) == 2
    first, second = model.mixers  # the stacked copy is drawn again, not equal
    assert not torch.equal(
        next(first.parameters()),
        next(second.parameters()),  # type: ignore[union-attr]
    )
    tokens = torch.randint(0, 12, (4, 9))
    assert model(tokens).shape == (4, 12)
    _all_grads(model, tokens)


@pytest.mark.parametrize("name", ["sdpa_mixer", "nmf_mixer"])
def test_final_position_sees_every_position(name: str) -> None:
    """Changing any one earlier token changes the final logits (a global mixer); with no
    mixer only the final token matters."""
    torch.manual_seed(0)
    options = {} if name == "sdpa_mixer" else {"rank": 3}
    model = build_model(TOKENS, ih.make_context(name, 16, **options),
                        ModelConf(arch="transformer", width=16)).eval()  # fmt: skip
    plain = build_model(TOKENS, ih.make_context("none", 16),
                        ModelConf(arch="transformer", width=16)).eval()  # fmt: skip
    tokens = torch.randint(0, 11, (1, 9))
    with torch.no_grad():
        for position in range(8):
            changed = tokens.clone()
            changed[0, position] = 11
            assert not torch.allclose(model(tokens), model(changed)), position
            assert torch.equal(plain(tokens), plain(changed)), position


def test_cnn_context_sees_every_position() -> None:
    """With a global context the logits depend on every position through it; a position's
    change reaches the pooled features even where the convolutions alone would not."""
    torch.manual_seed(0)
    model = ConvClassifier1d(1, 10, ih.make_context("sdpa_attention", 8), width=8)
    x = torch.randn(3, 1, 16, requires_grad=True)
    h = model.backbone(x)
    g = model.context(h.unsqueeze(2)).squeeze(2)
    g[:, :, 0].sum().backward()  # the context's output at position 0
    assert x.grad is not None and bool((x.grad[:, 0, -1] != 0).all())  # reached from position 15


@pytest.mark.parametrize(
    "model",
    [
        lambda: ConvClassifier1d(1, 10, ih.make_context("nmf", 8, rank=2), width=8),
        lambda: ConvClassifier1d(1, 10, ih.make_context("none", 8), width=8),
        lambda: MLPClassifier(16, 10, 20),
        lambda: GRUClassifier(1, 16, 10, 8),
        lambda: StridedConvClassifier1d(1, 16, 10, 8),
        lambda: DEQClassifier1d(
            1, 10, width=8, solver=ih.FixedPointIteration(max_steps=8), adjoint=ih.Unroll()
        ),
        lambda: DEQClassifier1d(1, 10, width=8, adjoint=ih.Implicit(), stabilise="spectral"),
    ],
)
def test_series_models_shapes_and_gradients(model: object) -> None:
    torch.manual_seed(0)
    net = model()  # type: ignore[operator]
    x = torch.randn(4, 1, 16)
    assert net(x).shape == (4, 10)
    _all_grads(net, x)


def test_deq_runs_the_configured_solve() -> None:
    torch.manual_seed(0)
    solver = ih.Anderson(max_steps=40, tol=1e-5)
    net = DEQClassifier1d(1, 10, width=8, solver=solver, adjoint=ih.OneStep())
    x = torch.randn(2, 1, 16)
    net(x)
    sol = net.last_solution
    assert sol is not None
    z = sol.value
    inj = net.inject(net.stem(x))
    residual = float((net.cell(z, inj) - z).norm() / z.norm())
    assert residual < 1e-3  # a fixed point of the cell (the solve's tolerance 1e-5, per sample)


def test_wrong_arch_for_the_data_is_refused() -> None:
    with pytest.raises(ValueError, match="token ids"):
        build_model(TOKENS, ih.make_context("none", 16), ModelConf(arch="cnn1d"))
    with pytest.raises(ValueError, match="real-valued"):
        build_model(SERIES, ih.make_context("none", 16), ModelConf(arch="transformer"))
    with pytest.raises(ValueError, match="no context block"):
        build_model(SERIES, ih.make_context("nmf", 8, rank=2), ModelConf(arch="mlp", width=8))
    image = TaskInfo("classification", 10, 1, None, (8, 8))
    with pytest.raises(ValueError, match="sequence classification"):
        build_model(image, ih.make_context("none", 16), ModelConf(arch="gru"))


@pytest.mark.parametrize(
    "overrides",
    [
        ["data=h3_induction", "data.num_examples=48", "data.num_test_examples=16",
         "model.arch=transformer", "model.width=16", "context=nmf_mixer", "adjoint=one_step"],
        ["data=h3_associative_recall", "data.num_examples=48", "data.num_test_examples=16",
         "model.arch=transformer", "model.width=16", "context=sdpa_mixer"],
        ["data=mnist1d", "data.num_samples=100", "model.arch=deq1d", "model.width=8",
         "context=none", "solver=anderson", "adjoint=phantom", "model.stabilise=spectral"],
    ],
)  # fmt: skip
def test_tiny_job_through_the_engine(overrides: list[str], tmp_path: object) -> None:
    cfg = compose_overrides([*overrides, "epochs=2", "batch_size=16", "progress=false",
                             "logger=none", "diagnostics.enabled=false"])  # fmt: skip
    results = run_training(cfg, f"{tmp_path}/job")
    assert results["status"] == "ok"
    assert 0.0 <= results["metrics"]["val/accuracy"] <= 1.0
    assert results["metrics"]["epoch"] == 2


def test_early_stop_at_accuracy(tmp_path: object) -> None:
    """stop_at_accuracy=0 stops after the first epoch, and the job counts as finished."""
    overrides = ["data=mnist1d", "data.num_samples=100", "model.arch=mlp", "model.width=8",
                 "context=none", "epochs=5", "batch_size=16", "progress=false", "logger=none",
                 "diagnostics.enabled=false", "stop_at_accuracy=0.0"]  # fmt: skip
    cfg = compose_overrides(overrides)
    first = run_training(cfg, f"{tmp_path}/job")
    assert first["metrics"]["epoch"] == 1
    again = run_training(cfg, f"{tmp_path}/job")  # finished: its results, not a retraining
    assert again["train_time_s"] == first["train_time_s"]


def test_mnist1d_baselines_have_the_published_sizes() -> None:
    """The package's baselines on N = 40, 10 classes, counted from their definitions by hand:
    MLP 40*100+100 + 100*100+100 + 100*10+10; ConvBase (25 channels) 25*5+25 + 2*(25*25*3+25) +
    125*10+10; GRUBase (6, bidirectional) 2*3*(6*1 + 6*6 + 2*6) + 40*12*10+10."""

    def count(net: torch.nn.Module) -> int:
        return sum(p.numel() for p in net.parameters())

    assert count(MLPClassifier(40, 10, 100)) == 15210
    assert count(StridedConvClassifier1d(1, 40, 10, 25)) == 5210
    assert count(GRUClassifier(1, 40, 10, 6)) == 5134
    with pytest.raises(ValueError, match="too short"):
        StridedConvClassifier1d(1, 2, 10)
