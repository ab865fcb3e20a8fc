"""Hamburger vs attention: latency, FLOPs, memory and achieved GFLOP/s, all in one process.

For B = 1, C channels and each H = W in ``--sizes`` it measures every module in ``--modules``
(forward under no-grad in eval mode, and a training step = forward + backward to the input and
the parameters; medians over interleaved rounds), counts their FLOPs, measures the bytes saved
for backward and the allocator's peak (see ``experiments/benchmarks/measure.py``), and prints one
table
per size with ratios to self-attention and SDPA and the achieved forward GFLOP/s against the
rate of a square fp32 matmul timed in the same rounds (under the same machine noise). A second
table sweeps K and the backward mode for the bare NMF ham; a last one checks the performance
targets (docs/benchmarks.md).

Module names: a context name ("nmf", "cd", "vq": a Hamburger v1 block of about 2 C^2 weights,
the paper's 0.5M-parameter ham at C = 512; "self_attention", "sdpa_attention": 4 C^2 weights),
a reference block ("nmf_reference", "vq_reference", "cd_reference": the same block around the
plain formulation of ``implicit_ham.decompositions.reference``), "ham:<name>" for the bare
decomposition, and a "+compile" suffix for ``compile=True``. Hams: r = 64, K = 6 (training
and evaluation), the paper's one-step gradient.

    python -m experiments.bench                                  # sizes 32 64, a few minutes
    python -m experiments.bench --sizes 32 64 96 128             # the full table (CPU: long)
    python -m experiments.bench --device cuda --sizes 32 64 96 128
    python -m experiments.bench --threads 1 --clock cpu          # stable on a shared CPU host
"""

from __future__ import annotations

import argparse
import itertools
import json
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

import implicit_ham as ih
from experiments.benchmarks.adjoints import ADJOINTS
from experiments.benchmarks.measure import (
    CLOCKS,
    MIB,
    Step,
    configure_threads,
    count_flops,
    interleaved_medians,
    peak_bytes,
    saved_bytes,
    square_matmul,
)
from implicit_ham.decompositions.reference import ReferenceCD, ReferenceNMF, ReferenceVQ
from implicit_ham.diagnostics import Rows

REFERENCES = {
    "nmf_reference": ReferenceNMF,
    "vq_reference": ReferenceVQ,
    "cd_reference": ReferenceCD,
}
ATTENTION = ("self_attention", "sdpa_attention")
DEFAULT_MODULES = (
    "nmf", "cd", "vq", "nmf_reference", "ham:nmf", "ham:nmf_reference", *ATTENTION,
)  # fmt: skip


LEGEND = """columns: fwd_GF / train_GF = GFLOP (FlopCounterMode) of the forward / training step;
fwd_ms = no-grad eval forward, train_ms = forward + backward (medians); saved_MiB = bytes saved
for backward; peak_MiB / inf_MiB = allocator peak above the start level during a training step /
a no-grad forward; GF/s = fwd_GF / fwd_ms; %mm = GF/s in % of the square matmul rate;
SA/x, SDPA/x = training time of self-attention / SDPA over this row's; *_mem = same for peak_MiB."""


@dataclass(frozen=True)
class Setup:
    """What every module of a run shares."""

    channels: int
    rank: int
    steps: int
    device: torch.device
    repeats: int
    warmup: int
    clock: str
    matmul_size: int


def make_ham(name: str, setup: Setup, compile_: bool, **options: object) -> ih.Decomposition:
    """The decomposition ``name`` (registry name or reference name), K steps in training and
    evaluation."""
    kwargs: dict[str, object] = {
        "rank": setup.rank,
        "steps": setup.steps,
        "eval_steps": setup.steps,
        "compile": compile_,
        **options,
    }
    if name in REFERENCES:
        return REFERENCES[name](**kwargs)  # type: ignore[arg-type]
    return ih.make_decomposition(name, **kwargs)


def make_module(spec: str, setup: Setup) -> tuple[nn.Module, bool]:
    """The module a spec names (see the module doc) and whether its input must be >= 0."""
    name, _, suffix = spec.partition("+")
    if suffix not in ("", "compile"):
        raise ValueError(f"unknown suffix +{suffix} in {spec!r}; the only suffix is +compile")
    compile_ = suffix == "compile"
    if name in ATTENTION:
        if compile_:
            raise ValueError(f"{spec!r}: +compile applies to hams only")
        return ih.make_context(name, setup.channels), False
    if name.startswith("ham:"):
        ham = make_ham(name[4:], setup, compile_)
        return ham, ham.nonnegative
    ham = make_ham(name, setup, compile_, channels=setup.channels)
    return ih.Hamburger(setup.channels, ham, version="v1"), False


def module_step(module: nn.Module, x: torch.Tensor) -> Step:
    """Training step (train mode, loss = sum of the output) and no-grad eval forward."""

    def loss() -> torch.Tensor:
        return module(x).sum()

    def reset() -> None:
        module.zero_grad(set_to_none=True)
        x.grad = None

    def infer() -> torch.Tensor:
        module.eval()
        try:
            with torch.no_grad():
                return module(x)
        finally:
            module.train()

    return Step(loss, reset, infer)


def measure_size(specs: Sequence[str], size: int, setup: Setup) -> tuple[Rows, float]:
    """One table: every module at H = W = size; and the square matmul's GFLOP/s."""
    gen = torch.Generator().manual_seed(size)
    steps: dict[str, Step] = {}
    params: dict[str, int] = {}
    for spec in specs:
        module, nonnegative = make_module(spec, setup)
        module = module.to(setup.device)
        shape = (1, setup.channels, size, size)
        data = (
            torch.rand(shape, generator=gen) if nonnegative else torch.randn(shape, generator=gen)
        )
        steps[spec] = module_step(module, data.to(setup.device).requires_grad_())
        params[spec] = sum(p.numel() for p in module.parameters())
    cases = {(spec, "fwd"): step.infer for spec, step in steps.items()}
    cases.update({(spec, "train"): step.train for spec, step in steps.items()})
    matmul_fn, matmul_flops = square_matmul(setup.device, setup.matmul_size)
    cases[("matmul", "fwd")] = matmul_fn
    times = interleaved_medians(cases, setup.device, setup.repeats, setup.warmup, setup.clock)
    matmul = matmul_flops / 1e9 / (times[("matmul", "fwd")] * 1e-3)
    rows = Rows()
    for spec, step in steps.items():
        fwd_flops = count_flops(step.infer)
        step.reset()
        train_flops = count_flops(step.forward_backward)
        peak = step.train_peak_bytes(setup.device)
        infer_peak = peak_bytes(step.infer, setup.device)
        fwd_ms = times[(spec, "fwd")]
        rows.append(
            {
                "module": spec,
                "params_M": params[spec] / 1e6,
                "fwd_GF": fwd_flops / 1e9,
                "train_GF": train_flops / 1e9,
                "fwd_ms": fwd_ms,
                "train_ms": times[(spec, "train")],
                "saved_MiB": saved_bytes(step) / MIB,
                "peak_MiB": None if peak is None else peak / MIB,
                "inf_MiB": None if infer_peak is None else infer_peak / MIB,
                "GF/s": fwd_flops / 1e9 / (fwd_ms * 1e-3),
                "%mm": 100.0 * fwd_flops / 1e9 / (fwd_ms * 1e-3) / matmul,
            }
        )
    add_ratios(rows)
    return rows, matmul


def add_ratios(rows: Rows) -> None:
    """``SA/x`` (training time and peak of self-attention over each row's) and ``SDPA/x``."""
    by_name = {row["module"]: row for row in rows}
    for baseline, label in (("self_attention", "SA"), ("sdpa_attention", "SDPA")):
        base = by_name.get(baseline)
        if base is None:
            continue
        for row in rows:
            row[f"{label}/x"] = base["train_ms"] / row["train_ms"]
            if base["peak_MiB"] and row["peak_MiB"]:
                row[f"{label}/x_mem"] = base["peak_MiB"] / row["peak_MiB"]


def measure_sweep(size: int, ks: Sequence[int], modes: Sequence[str], setup: Setup) -> Rows:
    """The bare NMF ham at H = W = size for every backward mode and K: no-grad forward,
    training step, their ratio, saved bytes and peak."""
    gen = torch.Generator().manual_seed(size)
    data = torch.rand((1, setup.channels, size, size), generator=gen).to(setup.device)
    steps = {}
    for mode in modes:
        for k in ks:
            ham = ih.NMF(rank=setup.rank, steps=k, eval_steps=k, adjoint=ADJOINTS[mode])
            steps[(mode, k)] = module_step(ham, data.clone().requires_grad_())
    cases = {(key, "fwd"): step.infer for key, step in steps.items()}
    cases.update({(key, "train"): step.train for key, step in steps.items()})
    with warnings.catch_warnings():  # GMRES on NMF's ill-conditioned fixed point: expected
        warnings.simplefilter("ignore", ih.ConvergenceWarning)
        times = interleaved_medians(cases, setup.device, setup.repeats, setup.warmup, setup.clock)
        rows = Rows()
        for (mode, k), step in steps.items():
            peak = step.train_peak_bytes(setup.device)
            fwd, train = times[((mode, k), "fwd")], times[((mode, k), "train")]
            rows.append(
                {
                    "mode": mode,
                    "K": k,
                    "fwd_ms": fwd,
                    "train_ms": train,
                    "train/fwd": train / fwd,
                    "saved_MiB": saved_bytes(step) / MIB,
                    "peak_MiB": None if peak is None else peak / MIB,
                }
            )
    return rows


def target_rows(tables: dict[int, Rows], sweep: Rows, steps: int) -> Rows:
    """The performance targets (docs/benchmarks.md), each with the measured value and whether it
    is met (rows whose modules were not measured are left out)."""
    rows = Rows()

    def add(target: str, value: float, goal: float, at_most: bool = False, note: str = "") -> None:
        """A target met when ``value >= goal`` (``<= goal`` when ``at_most``)."""
        met = value <= goal if at_most else value >= goal
        bound = f"{'<=' if at_most else '>='} {goal:g}{note}"
        rows.append({"target": target, "value": value, "goal": bound, "met": met})

    def cell(size: int, module: str, column: str) -> float | None:
        rows_at = tables.get(size, Rows())
        return next((r.get(column) for r in rows_at if r["module"] == module), None)

    top = max(tables)
    for column, goal in (("SA/x", 15.0), ("SDPA/x", 8.0), ("SA/x_mem", 26.0)):
        value = cell(top, "nmf", column)
        if value is not None:
            add(f"{column} of nmf at {top}x{top}", value, goal)
    for size in sorted(tables):
        value = cell(size, "ham:nmf", "%mm")
        if size >= 64 and value is not None:
            add(f"ham:nmf forward % of matmul rate at {size}x{size}", value, 50)
    for prefix in ("ham:", ""):
        fast, plain = (
            cell(64, f"{prefix}nmf", "train_ms"),
            cell(64, f"{prefix}nmf_reference", "train_ms"),
        )
        if 64 in tables and fast and plain:
            add(f"{prefix}nmf_reference / {prefix}nmf train time at 64x64", plain / fast, 1.5)
    by_key = {(r["mode"], r["K"]): r for r in sweep}
    if ("one_step", steps) in by_key:
        ratio = by_key[("one_step", steps)]["train/fwd"]
        add(f"one_step train / no-grad forward at K={steps}", ratio, 1.3, at_most=True)
    for mode in ("one_step", "implicit(gmres,20)"):
        saved = [r["saved_MiB"] for r in sweep if r["mode"] == mode]
        if len(saved) > 1:
            spread = max(saved) / min(saved)
            add(f"{mode} saved bytes max/min over K", spread, 1.1, at_most=True, note=" (flat)")
    unroll = sorted((r["K"], r["saved_MiB"]) for r in sweep if r["mode"] == "unroll")
    if len(unroll) > 2:
        slopes = [(b[1] - a[1]) / (b[0] - a[0]) for a, b in itertools.pairwise(unroll)]
        deviation = (max(slopes) - min(slopes)) / max(slopes)
        target = "unroll saved MiB per step: relative spread of slopes"
        add(target, deviation, 0.1, at_most=True, note=" (linear)")
    return rows


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[32, 64], help="H = W values")
    parser.add_argument("--modules", nargs="+", default=list(DEFAULT_MODULES), help="see doc")
    parser.add_argument("--compile", action="store_true", help="add nmf+compile, ham:nmf+compile")
    parser.add_argument("--channels", type=int, default=512, help="C")
    parser.add_argument("--rank", type=int, default=64, help="r")
    parser.add_argument("--steps", type=int, default=6, help="K of the module table")
    parser.add_argument("--sweep-size", type=int, default=64, help="H = W of the K sweep")
    parser.add_argument("--sweep-steps", type=int, nargs="*", default=[1, 6, 16], help="K values")
    parser.add_argument(
        "--sweep-modes",
        nargs="*",
        default=["one_step", "unroll", "implicit(gmres,20)"],
        choices=list(ADJOINTS),
        help="backward modes of the sweep",
    )
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds (median)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds first")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    parser.add_argument("--clock", default="wall", choices=CLOCKS, help="wall or process CPU")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    parser.add_argument(
        "--matmul-size", type=int, default=None, help="square matmul (2048 on CPU, else 8192)"
    )
    parser.add_argument("--json", default=None, help="also write the tables to this JSON file")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict[str, Rows]:
    """Run the benchmark; print and return its tables."""
    args = parse_args(argv)
    threads = configure_threads(args.threads)
    device = torch.device(args.device)
    size = args.matmul_size or (2048 if device.type == "cpu" else 8192)
    setup = Setup(
        args.channels, args.rank, args.steps, device, args.repeats, args.warmup, args.clock, size
    )
    specs = list(args.modules) + (["nmf+compile", "ham:nmf+compile"] if args.compile else [])
    print(
        f"device={device} torch={torch.__version__} threads={threads} clock={args.clock} "
        f"repeats={args.repeats} C={args.channels} r={args.rank} K={args.steps}"
    )
    print(LEGEND)
    tables: dict[int, Rows] = {}
    rates: dict[int, float] = {}
    for hw in args.sizes:
        tables[hw], rates[hw] = measure_size(specs, hw, setup)
        print(
            f"\nB=1 C={args.channels} H=W={hw}; fp32 matmul {size}x{size} in the same rounds: "
            f"{rates[hw]:.1f} GFLOP/s\n{tables[hw]}"
        )
    sweep = Rows()
    if args.sweep_steps and args.sweep_modes:
        sweep = measure_sweep(args.sweep_size, args.sweep_steps, args.sweep_modes, setup)
        print(f"\nbare NMF ham, H=W={args.sweep_size}: K sweep x backward mode\n{sweep}")
    targets = target_rows(tables, sweep, args.steps)
    print(f"\ntargets\n{targets}")
    result = {str(hw): rows for hw, rows in tables.items()}
    matmul = Rows({"size": hw, "matmul_GFLOP/s": rate} for hw, rate in rates.items())
    out = {"matmul": matmul, **result, "sweep": sweep, "targets": targets}
    if args.json:
        setup_info = {"channels": args.channels, "rank": args.rank, "steps": args.steps}
        payload = {"setup": setup_info | {"threads": threads, "clock": args.clock}, **out}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(payload, indent=1, default=list))
    return out


if __name__ == "__main__":
    main()
