"""The measurement behind ``Auto``'s ``dense_max`` (implicit_ham/adjoints/auto_solve.py): the
implicit backward pass of a fixed-point layer solved densely (``Dense`` for one sample,
``PerSampleDense`` for a batch) against GMRES (scaled, as ``Implicit`` runs it by default above
the threshold, and unscaled, the default before), at N = 8..256 unknowns per sample, float32
and float64, batch 1 and 64.

The map is ``z -> tanh(W z + x)`` per sample, W a random orthogonal matrix times 0.9 (GMRES
needs tens of products for tol=1e-5: the common case of a contractive DEQ-style map). Times
are medians of interleaved rounds (``measure.interleaved_medians``) of one backward pass
(``torch.autograd.grad`` with ``retain_graph``: the solve is redone each time), in
milliseconds; the process CPU time on the CPU (one thread), the wall clock on an accelerator.

    python -m experiments.benchmarks.dense_threshold --device cpu \
        --out docs/results/backward_threshold_cpu
"""

from __future__ import annotations

import argparse
import json
import platform
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

import implicit_ham as ih
from experiments.benchmarks.measure import interleaved_medians
from implicit_ham.adjoints.per_sample import PerSampleDense

SIZES = (8, 16, 32, 64, 128, 256)
BATCHES = (1, 64)
DTYPES = {"float32": torch.float32, "float64": torch.float64}
RADIUS = 0.9


def _backward(
    n: int, batch: int, dtype: torch.dtype, device: torch.device, solver: ih.linalg.LinearSolver,
    scaling: bool,
) -> tuple[Callable[[], object], list[ih.BackwardStats]]:
    """One backward pass of the tanh layer as a closure, and the stats list it appends to."""
    gen = torch.Generator().manual_seed(n)
    q, _ = torch.linalg.qr(torch.randn(n, n, generator=gen, dtype=torch.float64))
    w = (RADIUS * q).to(device, dtype)
    x = torch.randn(batch, n, generator=gen, dtype=torch.float64).to(device, dtype)
    x.requires_grad_()
    v = torch.randn(batch, n, generator=gen, dtype=torch.float64).to(device, dtype)
    adjoint = ih.Implicit(linear_solver=solver, cond_threshold=None, scaling=scaling)
    sol = ih.fixed_point(
        lambda z, x: torch.tanh(z @ w.T + x),
        torch.zeros_like(x),
        x,
        solver=ih.Anderson(max_steps=200, tol=1e-6 if dtype == torch.float32 else 1e-12),
        adjoint=adjoint,
    )
    value = sol.value
    assert isinstance(value, Tensor)

    def step() -> object:
        return torch.autograd.grad(value, x, v, retain_graph=True)

    return step, sol.backward_log


def measure(device: torch.device, repeats: int, warmup: int) -> list[dict[str, object]]:
    """One row per (dtype, batch, N): the median milliseconds and VJPs of each solve."""
    clock = "cpu" if device.type == "cpu" else "wall"
    rows: list[dict[str, object]] = []
    for dtype_name, dtype in DTYPES.items():
        for batch in BATCHES:
            for n in SIZES:
                dense = ih.linalg.Dense() if batch == 1 else PerSampleDense(batch)
                cases = {
                    "dense": _backward(n, batch, dtype, device, dense, False),
                    "gmres_scaled": _backward(n, batch, dtype, device, ih.linalg.GMRES(), True),
                    "gmres": _backward(n, batch, dtype, device, ih.linalg.GMRES(), False),
                }
                times = interleaved_medians(
                    {k: c[0] for k, c in cases.items()}, device, repeats, warmup, clock
                )
                row: dict[str, object] = {"dtype": dtype_name, "batch": batch, "n": n}
                for name, (_, log) in cases.items():
                    row[f"{name}_ms"] = round(times[name], 3)
                    row[f"{name}_vjps"] = log[-1].steps
                rows.append(row)
                print(row, flush=True)
    return rows


def markdown(rows: list[dict[str, object]], device: str) -> str:
    """The table of the docs page."""
    lines = [
        f"Measured on {device} by `python -m experiments.benchmarks.dense_threshold`; "
        "milliseconds per backward pass (median), products in brackets.",
        "",
        "| dtype | B | N | dense | GMRES scaled | GMRES unscaled | dense / scaled GMRES |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ratio = float(r["dense_ms"]) / float(r["gmres_scaled_ms"])  # type: ignore[arg-type]
        lines.append(
            f"| {r['dtype']} | {r['batch']} | {r['n']} | {r['dense_ms']} ({r['dense_vjps']}) | "
            f"{r['gmres_scaled_ms']} ({r['gmres_scaled_vjps']}) | {r['gmres_ms']} "
            f"({r['gmres_vjps']}) | {ratio:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--out", type=Path, required=True, help="path stem: .json and .md")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(1)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor()
    label = f"{device.type} ({name or platform.machine()}, torch {torch.__version__})"
    rows = measure(device, args.repeats, args.warmup)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps({"device": label, "rows": rows}, indent=1))
    args.out.with_suffix(".md").write_text(markdown(rows, label))


if __name__ == "__main__":
    main()
