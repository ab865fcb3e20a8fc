"""Evaluation with corrupt validation inputs: a sample with NaN / inf is left out of every
metric and counted, the others score exactly as without it."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

from experiments.engine.task import Task, evaluate

TASK = Task("classification", 3)


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return torch.randn(10, 4, generator=generator), torch.randint(3, (10,), generator=generator)


def test_non_finite_samples_are_left_out_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    x, y = _data()
    clean = evaluate(model, [(x[:5], y[:5]), (x[6:], y[6:])], TASK, device=torch.device("cpu"))
    corrupt = x.clone()
    corrupt[5, 2] = float("nan")
    with caplog.at_level(logging.WARNING):
        got = evaluate(model, [(corrupt[:6], y[:6]), (corrupt[6:], y[6:])], TASK,
                       device=torch.device("cpu"))  # fmt: skip
    assert got.pop("val/nonfinite_inputs") == 1.0
    assert got == pytest.approx(clean)
    assert "1 sample(s) with NaN / inf inputs left out" in caplog.text
    with pytest.raises(ValueError, match="all 1 validation samples have NaN / inf inputs"):
        evaluate(model, [(corrupt[5:6], y[5:6])], TASK, device=torch.device("cpu"))


def test_clean_data_reports_no_count() -> None:
    x, y = _data()
    metrics = evaluate(nn.Linear(4, 3), [(x, y)], TASK, device=torch.device("cpu"))
    assert "val/nonfinite_inputs" not in metrics
