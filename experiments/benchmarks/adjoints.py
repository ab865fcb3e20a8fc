"""Cost of each backward mode of the core on a Hamburger-sized problem: time and memory vs K.

The problem is the library's own: ``ih.NMF(rank=r).implicit_problem(x)`` for x (1, d, H, W),
i.e. the NMF iteration on X (1, d, n = H*W) with the state (D (1, d, r), C (1, n, r)). For every
backward mode and every number of forward steps K it times a full training step (build the
problem, ``problem.solve(FixedPointIteration(K), adjoint)``, the readout ``D C^T`` and a
backward pass to x; median over ``--repeats`` interleaved rounds) and measures the bytes
autograd saves for the backward and the allocator's peak during the step. Implicit-type modes
also report their backward solve (VJPs spent, relative residual): NMF's fixed point is
ill-conditioned (docs/hamburger.md §3), so GMRES with 20 steps is not expected to converge.

    python -m experiments.benchmarks.adjoints                       # d=512, n=4096, r=64,
    K=1,6,16,32
    python -m experiments.benchmarks.adjoints --threads 1 --clock cpu   # stable on a shared CPU
    host
"""

from __future__ import annotations

import argparse
import logging
import warnings
from collections.abc import Sequence
from typing import cast

import torch

import implicit_ham as ih
from experiments.benchmarks.measure import (
    CLOCKS,
    MIB,
    Step,
    configure_threads,
    interleaved_medians,
    saved_bytes,
)
from implicit_ham.decompositions.base import State
from implicit_ham.diagnostics import Rows

logger = logging.getLogger(__name__)

ADJOINTS: dict[str, ih.plugins.Adjoint] = {
    "unroll": ih.Unroll(),
    "one_step": ih.OneStep(),
    "truncated(2)": ih.Truncated(2),
    "phantom(3,0.5)": ih.Phantom(3, 0.5),
    "neumann(5,0.5)": ih.Neumann(5, 0.5),
    "implicit(gmres,20)": ih.Implicit(linear_solver="gmres", max_steps=20),
}


def problem_step(
    ham: ih.Decomposition,
    x: torch.Tensor,
    bases: torch.Tensor,
    steps: int,
    adjoint: ih.plugins.Adjoint,
) -> tuple[Step, list[ih.Solution]]:
    """The training step of one (K, backward mode) case on ``ham``'s implicit problem for x,
    and a list holding the latest step's ``Solution`` (its backward log fills in backward)."""
    solver = ih.FixedPointIteration(max_steps=steps)
    latest: list[ih.Solution] = []

    def loss() -> torch.Tensor:
        problem = ham.implicit_problem(x, init=bases)
        solution = problem.solve(solver, adjoint)
        latest[:] = [solution]
        state = cast(State, solution.value)  # a decomposition's state (D, C), as its z0
        return ham.readout(problem.args[0], state).sum()

    def infer() -> torch.Tensor:
        with torch.no_grad():
            return loss()

    def reset() -> None:
        x.grad = None
        latest.clear()

    return Step(loss, reset, infer), latest


def run(
    channels: int = 512,
    size: int = 64,
    rank: int = 64,
    steps: Sequence[int] = (1, 6, 16, 32),
    adjoints: Sequence[str] = tuple(ADJOINTS),
    repeats: int = 5,
    warmup: int = 1,
    device: str = "cpu",
    clock: str = "wall",
) -> Rows:
    """Measure every (backward mode, K) case; return one row per case (see the module doc)."""
    unknown = sorted(set(adjoints) - set(ADJOINTS))
    if unknown:
        raise ValueError(f"unknown backward mode(s) {unknown}; choose from {', '.join(ADJOINTS)}")
    dev = torch.device(device)
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(1, channels, size, size, generator=gen).to(dev).requires_grad_()
    bases = torch.nn.functional.normalize(torch.rand(1, channels, rank, generator=gen), dim=1)
    ham = ih.NMF(rank=rank)
    cases = {
        (name, k): problem_step(ham, x, bases.to(dev), k, ADJOINTS[name])
        for k in steps
        for name in adjoints
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ih.ConvergenceWarning)
        times = interleaved_medians(
            {key: case.train for key, (case, _) in cases.items()}, dev, repeats, warmup, clock
        )
        rows = Rows()
        for (name, k), (case, latest) in cases.items():
            saved = saved_bytes(case)
            peak = case.train_peak_bytes(dev)
            backward = latest[0].backward_stats
            rows.append(
                {
                    "mode": name,
                    "K": k,
                    "train_ms": times[(name, k)],
                    "saved_MiB": saved / MIB,
                    "peak_MiB": None if peak is None else peak / MIB,
                    "bwd_vjps": None if backward is None else backward.steps,
                    "bwd_rel_res": None if backward is None else backward.rel_residual,
                }
            )
    return rows


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--channels", type=int, default=512, help="d (channels)")
    parser.add_argument("--size", type=int, default=64, help="H = W; n = size**2")
    parser.add_argument("--rank", type=int, default=64, help="r")
    parser.add_argument("--steps", type=int, nargs="+", default=[1, 6, 16, 32], help="K values")
    parser.add_argument("--adjoints", nargs="+", default=list(ADJOINTS), choices=list(ADJOINTS))
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds (median)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds first")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    parser.add_argument("--clock", default="wall", choices=CLOCKS, help="wall or process CPU")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> Rows:
    args = parse_args(argv)
    threads = configure_threads(args.threads)
    rows = run(**{option: value for option, value in vars(args).items() if option != "threads"})
    print(
        f"NMF implicit problem d={args.channels} n={args.size**2} r={args.rank}, "
        f"device={args.device}, threads={threads}, clock={args.clock}, "
        f"median of {args.repeats} (train_ms: problem + solve + readout + backward)"
    )
    print(rows)
    return rows


if __name__ == "__main__":
    main()
