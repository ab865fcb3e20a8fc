"""The supervised pairing check: its score is a balanced accuracy, and it trains the job's
discriminator (the page's table comes from its cases)."""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor, nn

from experiments.data.far_twins import FarTwinsDataset
from experiments.generation.job import GanJob
from experiments.generation.pairing_check import balanced_accuracy, check
from experiments.generation.report import pairing_table


class _Constant(nn.Module):
    def __init__(self, value: float) -> None:
        super().__init__()
        self.value = value

    def forward(self, x: Tensor) -> Tensor:
        return torch.full((x.shape[0], 4, 4), self.value)


def test_a_discriminator_blind_to_the_pairing_scores_one_half() -> None:
    data = FarTwinsDataset("val", size=64, seed=0)
    for value in (1.0, -1.0):
        assert balanced_accuracy(_Constant(value), data.canvases, data.labels) == 0.5


def test_check_reports_every_stage_and_moves_the_discriminator() -> None:
    job = replace(GanJob(arm="self_attention", seed=0), d_width=16, train_size=256)
    rows = check(job, steps=5, batch=8, every=2, val=64)
    assert [r["step"] for r in rows] == [0, 2, 4, 5]
    assert all(0.0 <= r["val_accuracy"] <= 1.0 for r in rows)
    assert rows[0]["gamma"] == 1.0 and rows[-1]["gamma"] != 1.0
    table = pairing_table([{"arm": "self_attention", "d_gate_init": 1.0, "steps": 5,
                            "curve": rows}])  # fmt: skip
    assert table is not None and len(table.rows) == 1
    assert pairing_table([]) is None
