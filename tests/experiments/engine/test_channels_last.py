"""``model.channels_last``: the network in the channels-last memory format computes what the
default format computes (float64, so only the order of the sums differs), for every
architecture and for a ham context, and a training run with it resumes from its checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from torch import nn

from experiments.config.groups import ModelConf, TrainConfig, register_configs
from experiments.config.typed import typed_config
from experiments.data.factory import TaskInfo
from experiments.engine.build import build_context, build_model, context_channels
from experiments.engine.run import run_training
from implicit_ham.adjoints.modes import Unroll
from implicit_ham.solvers.iteration import FixedPointIteration

CONF = Path(__file__).resolve().parents[3] / "conf"
SEGMENTATION = TaskInfo("segmentation", 3, 3, None, (32, 32))
CLASSIFICATION = TaskInfo("classification", 4, 3, None, (32, 32))


def _pair(task: TaskInfo, conf: ModelConf, context: str) -> tuple[nn.Module, nn.Module]:
    """The same network (same initial weights) in both formats, float64; ``context`` is a
    ham's config group option, or ``+arm/<option>`` for an arm (the attention modules)."""
    models = []
    for channels_last in (False, True):
        torch.manual_seed(0)
        channels = context_channels(task, conf)
        ctx_conf = _context_conf(context)
        ctx = build_context(ctx_conf, channels, FixedPointIteration(max_steps=3), Unroll())
        model = build_model(task, ctx, ModelConf(**{**vars(conf), "channels_last": channels_last}))
        models.append(model.double())
    return models[0], models[1]


def _context_conf(name: str) -> object:
    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        ham = [f"context={name}", "context.rank=4", "context.steps=3"]
        cfg = compose("config", overrides=ham if "/" not in name else [name.replace("/", "=")])
    return typed_config(cfg, TrainConfig).context


@pytest.mark.parametrize(
    ("task", "arch", "context"),
    [
        (SEGMENTATION, "serial", "nmf"),
        (SEGMENTATION, "serial", "vq"),
        (SEGMENTATION, "two_stream", "cd"),
        (CLASSIFICATION, "serial", "nmf"),
        (SEGMENTATION, "serial", "+arm/sdpa_matched32"),
        (SEGMENTATION, "two_stream", "+arm/self_attention_matched"),
    ],
)
def test_channels_last_network_equals_the_default_format(
    task: TaskInfo, arch: str, context: str
) -> None:
    plain, last = _pair(task, ModelConf(width=16, arch=arch), context)
    convs = [m for m in last.modules() if isinstance(m, nn.Conv2d)]
    assert convs and all(c.weight.is_contiguous(memory_format=torch.channels_last) for c in convs)
    assert not any(
        m.weight.is_contiguous(memory_format=torch.channels_last)
        for m in plain.modules()
        if isinstance(m, nn.Conv2d) and m.kernel_size != (1, 1)
    )
    gen = torch.Generator().manual_seed(1)
    images = torch.rand(2, 3, 32, 32, dtype=torch.float64, generator=gen)
    outs = []
    for model in (plain, last):
        torch.manual_seed(2)  # the hams draw their initial bases in the forward
        outs.append(model(images))
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-10, atol=1e-10)
    for out in outs:
        out.square().sum().backward()
    for (name, a), (_, b) in zip(plain.named_parameters(), last.named_parameters(), strict=True):
        assert a.grad is not None and b.grad is not None, name
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-9, atol=1e-10, msg=name)


def test_a_channels_last_run_trains_like_the_default_format(tmp_path: Path) -> None:
    """The engine's run (NMF context, implicit backward, 2 epochs) in both formats: both end
    ok, with float32 metrics that differ by rounding only, and the channels-last run's saved
    weights keep their format (a resumed run continues in it)."""
    tiny = [
        "epochs=2", "data.train_size=16", "data.val_size=8", "data.image_size=32",
        "data.num_classes=2", "context.rank=2", "context.steps=2", "context.eval_steps=2",
        "batch_size=8", "progress=false", "threads=1", "diagnostics.enabled=false",
        "model.width=16",
    ]  # fmt: skip
    register_configs()
    threads = torch.get_num_threads()
    results = {}
    try:
        for flag in ("false", "true"):
            with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
                cfg = compose("config", overrides=[*tiny, f"model.channels_last={flag}"])
            results[flag] = run_training(typed_config(cfg, TrainConfig), tmp_path / flag)
    finally:
        torch.set_num_threads(threads)
    assert results["false"]["status"] == results["true"]["status"] == "ok"
    plain, last = results["false"]["metrics"], results["true"]["metrics"]
    assert plain.keys() == last.keys()
    for key in (k for k in plain if not k.endswith("_s")):  # not the timings
        assert last[key] == pytest.approx(plain[key], rel=1e-3, abs=1e-4), key
    saved = torch.load(tmp_path / "true" / "checkpoint.pt", weights_only=False)["model"]
    kernels = [t for k, t in saved.items() if k.endswith("weight") and t.shape[-2:] == (3, 3)]
    assert kernels and all(t.is_contiguous(memory_format=torch.channels_last) for t in kernels)
