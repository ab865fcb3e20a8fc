"""The torchdeq comparison of ``python -m experiments.bench peers`` (its ``accuracy`` group)
and the ``bench`` dispatcher: every part resolves to a module with a ``main``; the accuracy
points are taken at equal budgets, ours and torchdeq's Anderson alike, and an unequal budget
is refused with the counts (it was an ``assert``: silent under ``python -O``)."""

from __future__ import annotations

import importlib

import pytest
import torch

from experiments import bench
from experiments.benchmarks.peers import deq


@pytest.mark.parametrize("part", sorted(bench.PARTS))
def test_every_bench_part_has_a_main(part: str) -> None:
    module = importlib.import_module(f"experiments.benchmarks.{bench.PARTS[part]}")
    assert callable(getattr(module, "main", None)), part


def test_accuracy_points_are_taken_at_the_budget() -> None:
    pytest.importorskip("torchdeq")
    points = deq.accuracy_points(5)
    assert set(points) == {"ours", "ours polish", "fixed point", "torchdeq"}
    shapes = {tuple(p.shape) for p in points.values()}
    assert len(shapes) == 1
    assert all(bool(torch.isfinite(p).all()) for p in points.values())


def test_an_unequal_budget_is_refused() -> None:
    with pytest.raises(RuntimeError, match="ours spent 4 evaluations of f, not the budget 3"):
        deq._check_budget("ours", 4, 3)
