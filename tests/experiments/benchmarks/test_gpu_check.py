"""The GPU check (``python -m experiments.gpu_check``) in its CPU mode: without CUDA it measures
nothing, says so, writes the "not measured yet" page (a measured page is left alone) and exits
0. Its measuring functions are device-agnostic: parts (b) to (e) run here on the CPU at tiny
sizes (gloo instead of nccl) and the page renders from them; part (a) needs CUDA."""

from __future__ import annotations

import logging
import math
import runpy
import sys
from pathlib import Path

import pytest
import torch

from experiments.benchmarks import gpu

CPU = torch.device("cpu")


@pytest.fixture
def no_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def test_without_cuda_it_says_so_writes_the_placeholder_and_exits_zero(
    no_cuda: None, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    page = tmp_path / "benchmarks_gpu.md"
    with caplog.at_level(logging.INFO):
        assert gpu.main(["--output", str(page)]) == 0
    assert "no CUDA device" in caplog.text
    text = page.read_text()
    assert gpu.NOT_MEASURED in text and "set_sync_debug_mode" in text
    measured = "# GPU check\n\nMeasured by `make gpu-check` on 2030-01-01.\n"
    page.write_text(measured)
    assert gpu.main(["--output", str(page)]) == 0
    assert page.read_text() == measured  # measurements are never replaced by the placeholder


def test_the_committed_page_states_it_has_not_been_measured_or_holds_measurements() -> None:
    text = gpu.PAGE.read_text()
    assert gpu.NOT_MEASURED in text or text.startswith("# GPU check\n\nMeasured by")


def test_the_command_module_runs_the_check(
    no_cuda: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    page = tmp_path / "page.md"
    monkeypatch.setattr(sys, "argv", ["gpu_check", "--output", str(page)])
    with pytest.raises(SystemExit) as done:
        runpy.run_module("experiments.gpu_check", run_name="__main__")
    assert done.value.code == 0 and gpu.NOT_MEASURED in page.read_text()


def finite(rows: list[dict], skip: tuple[str, ...] = ()) -> bool:
    values = [v for row in rows for k, v in row.items() if isinstance(v, float) and k not in skip]
    return bool(values) and all(math.isfinite(v) for v in values)


def test_the_parts_run_on_the_cpu_at_tiny_sizes_and_render() -> None:
    precision = gpu.run_section(
        "(b)", lambda: gpu.precision(CPU, dtypes=(torch.bfloat16,), channels=16, size=8, rank=2)
    )
    assert precision.error is None, precision.error
    assert [r["case"] for r in precision.rows][-1].startswith("DEQ")
    for row in precision.rows:  # bf16 autocast stays close to float64 (loose: a tiny block)
        assert 0.9 <= row["bfloat16 input"] <= 1.0 + 1e-9, row
        assert 0.9 <= row["bfloat16 params"] <= 1.0 + 1e-9, row
    timing = gpu.run_section(
        "(c)",
        lambda: gpu.ham_versus_attention(CPU, channels=16, size=8, rank=4, repeats=1, warmup=0),
    )
    head = gpu.run_section(
        "(d)",
        lambda: gpu.light_ham_head_timing(
            CPU,
            image=128,
            batches=(1,),
            in_channels=(32, 32, 32),
            channels=32,
            repeats=1,
            warmup=0,
        ),
    )
    ddp = gpu.run_section("(e)", lambda: gpu.ddp_step(CPU, backend="gloo"))
    for section in (timing, head, ddp):
        assert section.error is None, section.error
        assert finite(section.rows)
    assert [r["module"] for r in timing.rows] == [
        "Hamburger v1 (NMF)",
        "self-attention (materialised)",
    ]
    assert timing.rows[0]["peak allocated (MiB)"] is None  # CUDA only
    assert ddp.rows[0]["world size"] == 1
    assert ddp.rows[0]["max abs difference of the gradients (DDP vs plain)"] == 0.0
    failed = gpu.run_section("(a)", lambda: gpu.host_syncs(CPU))
    assert "needs a CUDA device" in (failed.error or "")
    page = gpu.render([precision, timing, head, ddp, failed], ["header line"])
    assert page.startswith("# GPU check\n\nheader line\n")
    assert "| case | bfloat16 input | bfloat16 params | bfloat16 warnings |" in page
    deq = precision.rows[-1]["bfloat16 warnings"]  # bf16 products: z* is a fixed point to ~1e-3
    assert deq == "ConvergenceWarning, NotFixedPointWarning", deq
    assert "## (a)\n\nFailed:" in page and "| – |" in page


@pytest.mark.cuda
def test_host_syncs_on_cuda_a_fixed_budget_solve_makes_none() -> None:
    rows, _ = gpu.host_syncs(torch.device("cuda"), ks=(1, 8))
    assert [r["solve, check_finite=False (error mode)"] for r in rows] == [
        "no sync (no error raised)"
    ] * 2
    assert (
        rows[0]["Hamburger v2 NMF forward (syncs)"] == rows[1]["Hamburger v2 NMF forward (syncs)"]
    )
