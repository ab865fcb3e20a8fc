"""The sequence-length cost benchmark: its fits, its crossover, a tiny run end to end, and the
committed page section against the committed measurement."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from experiments.benchmarks import sequence_cost as seq

ROOT = Path(__file__).resolve().parents[3]


def test_loglog_slope_recovers_a_power_law():
    lengths = [256, 512, 1024, 4096]
    assert seq.loglog_slope(lengths, [3e-4 * n**2 for n in lengths]) == pytest.approx(2.0)
    assert seq.loglog_slope(lengths, [7.0 * n**1.1 for n in lengths]) == pytest.approx(1.1)


def test_crossover_interpolates_in_log_log():
    lengths = [250, 500, 1000, 2000, 4000]
    ours = [float(n) for n in lengths]  # linear
    theirs = [n * n / 1500 for n in lengths]  # quadratic: equal at N = 1500
    text = seq.crossover(lengths, ours, theirs)
    assert text == "N ~ 1500 (between 1000 and 2000)"
    assert seq.crossover(lengths, [1.0] * 5, [2.0] * 5).startswith("ham cheaper at every N")
    assert seq.crossover(lengths, [2.0] * 5, [1.0] * 5) == "ham never cheaper (up to 4000)"
    flip = seq.crossover(lengths, [1, 3, 1, 3, 1], [2] * 5)
    assert flip == "order changes more than once; ham cheaper at N = 250, 1000, 4000"


def test_a_tiny_run_writes_its_json_and_only_the_page_section(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(f"# hand-written\n\n{seq.BEGIN}\nold\n{seq.END}\n\nkept below\n")
    out = tmp_path / "cost.json"
    argv = ["--lengths", "16", "32", "--rounds", "1", "--warmup", "0", "--slope-from", "16"]
    payload = seq.main([*argv, "--rank", "2", "--json", str(out), "--page", str(page)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(payload))
    assert set(payload["rows"]) == {"16", "32"}
    for cells in payload["rows"].values():
        assert set(cells) == set(seq.ARMS)
        assert all(c["ms"] > 0 and c["gflop"] > 0 for c in cells.values())
    # the attention step's FLOPs grow faster than the ham's (quadratic vs linear in N)
    rows = payload["rows"]
    growth = {a: rows["32"][a]["gflop"] / rows["16"][a]["gflop"] for a in seq.ARMS}
    assert growth[seq.SDPA] > growth[seq.HAM]
    text = page.read_text()
    assert text.startswith("# hand-written\n") and text.endswith("\n\nkept below\n")
    assert "old" not in text and "| 32 |" in text


def test_the_committed_page_section_is_generated_from_the_committed_json():
    data = ROOT / "docs" / "benchmarks_sequence" / "cost.json"
    page = (ROOT / "docs" / "benchmarks_sequence.md").read_text()
    section = seq.section(json.loads(data.read_text()))
    assert section in page
    lengths = sorted(int(n) for n in json.loads(data.read_text())["rows"])
    assert lengths[0] <= 256 and lengths[-1] >= 16384 and all(
        math.log2(n).is_integer() for n in lengths
    )


def test_a_page_without_markers_is_refused(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# no markers\n")
    with pytest.raises(ValueError, match="marker"):
        seq.write_page({}, page)
