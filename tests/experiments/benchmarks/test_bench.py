"""The benchmark scripts run end to end at a tiny size (right columns, finite numbers), and the
measuring tools they rely on report known quantities (FLOPs of a matmul, bytes of tensors whose
sizes are fixed here). No timing is asserted."""

from __future__ import annotations

import math

import pytest
import torch

import implicit_ham as ih
from experiments.benchmarks import adjoints as bench_adjoints
from experiments.benchmarks import blocks as bench
from experiments.benchmarks import page as bench_page
from experiments.benchmarks.measure import MIB, Step, count_flops, peak_bytes, saved_bytes

TINY = ["--channels", "16", "--rank", "2", "--steps", "2", "--repeats", "1", "--warmup", "0"]


@pytest.fixture(autouse=True)
def keep_thread_count():
    """The scripts set torch's thread count (``--threads``); restore it for later tests."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def finite_numbers(rows, skip=()) -> bool:
    values = [v for row in rows for k, v in row.items() if isinstance(v, float) and k not in skip]
    return bool(values) and all(math.isfinite(v) for v in values)


def test_count_flops_of_a_matmul_is_two_m_n_k():
    a, b = torch.randn(6, 5), torch.randn(5, 7)
    assert count_flops(lambda: a @ b) == 2 * 6 * 5 * 7


def test_attention_flops_are_counted_for_both_kernels():
    """Materialised and fused (CPU flash) attention compute the same forward: four C x C
    projections over N pixels and two N x N x C products."""
    c, hw = 16, 8
    n = hw * hw
    expected = 4 * 2 * c * c * n + 2 * 2 * n * n * c
    x = torch.randn(1, c, hw, hw)
    for name in ("self_attention", "sdpa_attention"):
        module = ih.make_context(name, c)
        assert count_flops(lambda m=module: m(x)) == expected


def test_cpu_peak_bytes_sees_a_temporary_that_is_freed():
    """Two 4 MiB tensors then one 16 MiB temporary: the peak is 24 MiB, the end 8 MiB."""

    def work() -> torch.Tensor:
        a = torch.ones(1024, 1024)
        b = a + 1
        c = torch.empty(4096, 1024).fill_(2.0)
        del c
        return b

    peak = peak_bytes(work, torch.device("cpu"))
    assert abs(peak - 24 * MIB) <= 0.01 * MIB


def test_saved_bytes_counts_each_saved_storage_once():
    """exp saves its output (4 KiB), mul by w saves x (4 KiB) and w (4 KiB); x is saved by
    two ops but counted once."""
    x = torch.randn(1024, requires_grad=True)
    w = torch.randn(1024, requires_grad=True)

    def loss() -> torch.Tensor:
        return (torch.exp(x) + x * w + x.sin()).sum()

    step = Step(loss, lambda: None, lambda: None)
    assert saved_bytes(step) == 3 * 1024 * 4


def test_bench_runs_at_a_tiny_size_with_every_column():
    tables = bench.main(
        [*TINY, "--sizes", "8", "--sweep-size", "8", "--sweep-steps", "1", "3",
         "--matmul-size", "32", "--threads", "1", "--modules", "nmf", "cd", "vq",
         "nmf_reference", "ham:nmf", "ham:nmf_reference", "self_attention", "sdpa_attention"]
    )  # fmt: skip
    assert tables["matmul"][0]["matmul_GFLOP/s"] > 0
    rows = tables["8"]
    assert [r["module"] for r in rows][:2] == ["nmf", "cd"] and len(rows) == 8
    expected = {"module", "params_M", "fwd_GF", "train_GF", "fwd_ms", "train_ms", "saved_MiB",
                "peak_MiB", "inf_MiB", "GF/s", "%mm", "SA/x", "SA/x_mem", "SDPA/x"}  # fmt: skip
    assert expected <= set(rows[0])
    assert finite_numbers(rows)
    by_name = {r["module"]: r for r in rows}
    assert by_name["self_attention"]["SA/x"] == 1.0
    assert by_name["nmf_reference"]["fwd_GF"] > by_name["nmf"]["fwd_GF"] > 0
    assert all(r["saved_MiB"] > 0 and r["peak_MiB"] > 0 for r in rows)
    sweep = tables["sweep"]
    assert {(r["mode"], r["K"]) for r in sweep} == {
        (m, k) for m in ("one_step", "unroll", "implicit(gmres,20)") for k in (1, 3)
    }
    assert finite_numbers(sweep)
    assert {r["target"].split(" ")[0] for r in tables["targets"]} >= {"SA/x", "one_step"}


def test_bench_adjoints_runs_at_a_tiny_size_with_every_mode():
    rows = bench_adjoints.main(
        ["--channels", "16", "--size", "4", "--rank", "2", "--steps", "2", "3",
         "--repeats", "1", "--warmup", "0", "--threads", "1"]
    )  # fmt: skip
    assert {(r["mode"], r["K"]) for r in rows} == {
        (m, k) for m in bench_adjoints.ADJOINTS for k in (2, 3)
    }
    assert finite_numbers(rows)
    by_key = {(r["mode"], r["K"]): r for r in rows}
    # 20 GMRES products and the 4 probes of Implicit's row scaling (a well-scaled system)
    assert by_key[("implicit(gmres,20)", 3)]["bwd_vjps"] == 24
    assert by_key[("unroll", 2)]["bwd_vjps"] is None
    assert by_key[("unroll", 3)]["saved_MiB"] > by_key[("unroll", 2)]["saved_MiB"]
    assert by_key[("one_step", 3)]["saved_MiB"] == by_key[("one_step", 2)]["saved_MiB"]


@pytest.mark.skipif(
    not hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu"),
    reason="this PyTorch build has no CPU flash-attention kernel",
)
def test_sdpa_baseline_does_not_materialise_the_attention_matrix():
    """SDPAttention2d must reach the fused kernel: its forward peak stays far below one
    N x N float32 matrix (64 MiB at N = 4096), which SelfAttention2d allocates."""
    x = torch.randn(1, 16, 64, 64)
    n_by_n = (64 * 64) ** 2 * 4
    fused_module, plain_module = (
        ih.make_context(n, 16) for n in ("sdpa_attention", "self_attention")
    )
    with torch.no_grad():
        fused = peak_bytes(lambda: fused_module(x), torch.device("cpu"))
        plain = peak_bytes(lambda: plain_module(x), torch.device("cpu"))
    assert fused < 0.1 * n_by_n < n_by_n <= plain


def test_bench_page_rewrites_only_the_generated_part(tmp_path):
    page = tmp_path / "benchmarks.md"
    page.write_text(f"# Benchmarks\n\nhand-written reading\n\n{bench_page.MARKER}\n\nold tables\n")
    tiny_bench = (
        "--sizes 8 --sweep-size 8 --sweep-steps 1 --matmul-size 32 --threads 1 "
        "--repeats 1 --warmup 0 --channels 16 --rank 2 --modules nmf ham:nmf"
    )
    tiny_adjoints = "--channels 16 --size 4 --rank 2 --steps 2 --repeats 1 --warmup 0"
    bench_page.main(["--out", str(page), "--bench", tiny_bench, "--adjoints", tiny_adjoints])
    text = page.read_text()
    head, generated = text.split(bench_page.MARKER)
    assert head == "# Benchmarks\n\nhand-written reading\n\n"
    assert "old tables" not in generated
    assert f"`python -m experiments.bench {tiny_bench}`:" in generated
    assert "H=W=8" in generated and "ham:nmf" in generated and "targets" in generated
    assert "NMF implicit problem d=16 n=16 r=2" in generated
    assert generated.count("```") == 4


def test_bench_page_refuses_a_page_without_its_marker(tmp_path):
    page = tmp_path / "benchmarks.md"
    page.write_text("# Benchmarks\n")
    with pytest.raises(ValueError, match="no marker line"):
        bench_page.write_page(page, [("python -m x", "table")])


def _peer_run(folder, ratio: float) -> None:
    import json

    row = {"target": "t", "case": "c", "peer": "p", "ours_ms": 1.0, "peer_ms": ratio,
           "ratio": ratio, "goal": ">= 1.1", "met": "yes" if ratio >= 1.1 else "no",
           "notes": "n"}  # fmt: skip
    folder.mkdir()
    (folder / "s.json").write_text(json.dumps({"section": "s", "meta": {}, "rows": [row]}))


def test_peer_page_keeps_a_hand_written_head_and_shows_both_runs(tmp_path):
    _peer_run(tmp_path / "1", 1.2)
    _peer_run(tmp_path / "2", 1.0)
    page = tmp_path / "page.md"
    bench_page.write_peer_page([tmp_path / "1", tmp_path / "2"], page)
    assert page.read_text().startswith("# Benchmarks against peers\n\nGenerated by")
    text = page.read_text().replace("# Benchmarks against peers", "# My layers\n\nRebuild: x.")
    page.write_text(text)
    bench_page.write_peer_page([tmp_path / "1", tmp_path / "2"], page)
    again = page.read_text()
    assert again.startswith("# My layers\n\nRebuild: x.\n\nGenerated by")
    assert again.count("Generated by") == 1
    assert "| t | c | p | >= 1.1 | 1.2 | 1 |" in again  # both runs' ratios; met needs both
    assert "| no |" in again


def test_interleaved_times_carry_the_quartiles_of_their_per_round_ratios(tmp_path):
    """``medians`` keeps each case's rounds; a row of two times from one call gets the
    quartiles of the per-round ratios (in the ratio's direction), checked against
    ``statistics.quantiles`` of ratios computed here from the rounds; times from two calls, or
    a cost that is not a time, get none. The JSON keeps plain numbers, and the page shows the
    quartiles in brackets after the ratio."""
    import json
    import statistics

    from experiments.benchmarks.peers.rows import Table, medians, write_json

    ticks = iter(range(1000))
    slow = {"peer": 0}

    def peer() -> None:  # a call that takes a few more "rounds" of work than ours
        slow["peer"] += 1
        for _ in range(2000 + 500 * (slow["peer"] % 3)):
            pass

    def ours() -> None:
        next(ticks)

    times = medians({"ours": ours, "peer": peer}, rounds=9, warmup=1)
    assert len(times["ours"].samples) == len(times["peer"].samples) == 9
    assert times["ours"] == statistics.median(times["ours"].samples)
    table = Table()
    table.add("t", "time", "p", times["ours"], times["peer"], 1.1)
    table.add_at_most("t", "cost", "p", times["ours"], times["peer"], 1.05)
    apart = medians({"peer": peer}, rounds=9)["peer"]
    table.add("t", "apart", "p", times["ours"], apart, 1.1)
    table.add("t", "floats", "p", 2.0, 3.0, 1.1)
    rows = {row["case"]: row for row in table.rows}
    pairs = list(zip(times["peer"].samples, times["ours"].samples, strict=True))
    for case, ratios in (("time", [p / o for p, o in pairs]), ("cost", [o / p for p, o in pairs])):
        first, _, third = statistics.quantiles(ratios, n=4)
        assert rows[case]["ratio_iqr"] == pytest.approx([first, third], rel=1e-12)
    assert "ratio_iqr" not in rows["apart"] and "ratio_iqr" not in rows["floats"]
    path = write_json(tmp_path / "run" / "s.json", "s", table, {})
    loaded = json.loads(path.read_text())["rows"][0]
    assert isinstance(loaded["ours_ms"], float) and loaded["ours_ms"] == float(times["ours"])
    page = bench_page.write_peer_page([tmp_path / "run"], tmp_path / "page.md").read_text()
    first, third = rows["time"]["ratio_iqr"]
    assert f"{rows['time']['ratio']:.4g} [{first:.3f}, {third:.3f}]" in page
