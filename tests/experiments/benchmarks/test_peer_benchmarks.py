"""The peer benchmarks' plumbing: the committed peer pages regenerate from their rows; the
torchdeq comparison of ``python -m experiments.bench peers`` (its ``accuracy`` group) and the
``bench`` dispatcher: every part resolves to a module with a ``main``; the accuracy
points are taken at equal budgets, ours and torchdeq's Anderson alike, and an unequal budget
is refused with the counts (it was an ``assert``: silent under ``python -O``)."""

from __future__ import annotations

import importlib
import shutil
from pathlib import Path

import pytest
import torch

from experiments import bench
from experiments.benchmarks.page import moved, write_peer_page
from experiments.benchmarks.peers import deq

DOCS = Path(__file__).resolve().parents[3] / "docs"


@pytest.mark.parametrize("part", sorted(bench.PARTS))
def test_every_bench_part_has_a_main(part: str) -> None:
    module = importlib.import_module(f"experiments.benchmarks.{bench.PARTS[part]}")
    assert callable(getattr(module, "main", None)), part


@pytest.mark.parametrize("budget", [5, 20])  # from 13 on, ours also measures z* (not counted)
def test_accuracy_points_are_taken_at_the_budget(budget: int) -> None:
    pytest.importorskip("torchdeq")
    points = deq.accuracy_points(budget)
    assert set(points) == {"ours", "ours polish", "fixed point", "torchdeq"}
    shapes = {tuple(p.shape) for p in points.values()}
    assert len(shapes) == 1
    assert all(bool(torch.isfinite(p).all()) for p in points.values())


def test_an_unequal_budget_is_refused() -> None:
    with pytest.raises(RuntimeError, match="ours spent 4 evaluations of f, not the budget 3"):
        deq._check_budget("ours", 4, 3)


@pytest.mark.parametrize("page", ["benchmarks_peers", "benchmarks_optlayers"])
def test_the_committed_peer_pages_are_their_rows(tmp_path: Path, page: str) -> None:
    """Each peer page is what ``bench page --peers-runs`` makes of its committed runs (a page
    edited by hand, as its set-up lines once were, fails here)."""
    committed = DOCS / f"{page}.md"
    copy = tmp_path / committed.name
    shutil.copy(committed, copy)
    write_peer_page([DOCS / page / "run1", DOCS / page / "run2"], copy)
    assert copy.read_text() == committed.read_text()


def test_set_up_lines_name_todays_modules() -> None:
    """The committed runs recorded the modules of their day; the page names where that code
    lives now (each rewritten name must resolve: ``tests/docs/test_docs_names.py``)."""
    assert moved("python -m experiments.benchmarks.peers --rounds 10 --json a.json") == (
        "python -m experiments.benchmarks.peers.run --rounds 10 --json a.json"
    )
    assert moved("python -m experiments.benchmarks.peers_loops --json b") == (
        "python -m experiments.benchmarks.peers.loops --json b"
    )
    assert moved("/w/experiments/benchmarks/peers_theseus.py --json c") == (
        "/w/experiments/benchmarks/peers/theseus.py --json c"
    )
    today = "python -m experiments.benchmarks.peers.run --json d"
    assert moved(today) == today
