"""torch.compile against eager mode on this machine, and the graph breaks of the implicit modes.

Cases (float32): a Hamburger block (v2, NMF / VQ / CD) in training (one step = forward +
backward to the input and parameters) under OneStep and Unroll, and in evaluation (forward
under ``no_grad``); and ``fixed_point`` of ``z <- tanh(z W + x)`` with
``FixedPointIteration(tol=None)`` (training under OneStep / Unroll, evaluation). Each case is
built twice from the same seed, once wrapped in ``torch.compile`` (``fullgraph=True``: a graph
break would be an error), and timed as interleaved medians (eager and compiled alternate in
every round). ``inductor.config.fallback_random`` is set so that the random initial bases are the
same in both, and the first outputs are compared (``max_abs_diff``). ``compile_s`` is the first
compiled call (tracing, code generation, the C++ build) minus an eager call.

Then ``torch._dynamo.explain`` counts the graph breaks of an NMF block (on a (1, C, 8, 8)
input, so that Dense's matrix fits its ``max_size``) and of ``fixed_point`` under every mode:
the through-iteration ones, and Implicit / Neumann with and without a fixed-point tolerance.

    python -m experiments.benchmarks.compiled --threads 1 --repeats 10 --warmup 2   # both tables
    python -m experiments.benchmarks.compiled --breaks-only                        # graph breaks
"""

from __future__ import annotations

import argparse
import warnings
from collections.abc import Callable, Sequence
from functools import partial
from typing import cast

import torch
import torch._dynamo as dynamo
import torch._inductor.config as inductor_config
from torch import Tensor, nn

import implicit_ham as ih
from experiments.benchmarks.measure import (
    CLOCKS,
    clock_seconds,
    configure_threads,
    interleaved_medians,
)
from implicit_ham.diagnostics import Rows

HAMS: dict[str, type[ih.Decomposition]] = {"nmf": ih.NMF, "vq": ih.VQ, "cd": ih.CD}
TRAIN_MODES: dict[str, ih.plugins.Adjoint] = {"one_step": ih.OneStep(), "unroll": ih.Unroll()}
AT_POINT: dict[str, ih.plugins.Adjoint] = {
    "implicit(gmres)": ih.Implicit(linear_solver="gmres", max_steps=20),
    "implicit(dense)": ih.Implicit(linear_solver="dense"),
    "implicit(dense, fixed_point_tol=None)": ih.Implicit(
        linear_solver="dense", fixed_point_tol=None
    ),
    "neumann(5, 0.5)": ih.Neumann(5, 0.5),
    "neumann(5, 0.5, fixed_point_tol=None)": ih.Neumann(5, 0.5, fixed_point_tol=None),
}


class TanhLayer(nn.Module):
    """``fixed_point`` of ``z <- tanh(z W + x)`` from 0 with K plain steps (no tolerance)."""

    def __init__(self, width: int, steps: int, adjoint: ih.plugins.Adjoint) -> None:
        super().__init__()
        weight = torch.randn(width, width)
        self.weight = nn.Parameter(0.5 * weight / torch.linalg.matrix_norm(weight, ord=2))
        self.solver, self.adjoint = ih.FixedPointIteration(max_steps=steps), adjoint

    def forward(self, x: Tensor) -> Tensor:
        """x (B, width) -> z* (B, width)."""
        solution = ih.fixed_point(
            lambda z, x_: torch.tanh(z @ self.weight + x_),
            torch.zeros_like(x),
            x,
            solver=self.solver,
            adjoint=self.adjoint,
        )
        return cast(Tensor, solution.value)  # z0 is one tensor, so is the value


def block(ham: str, adjoint: ih.plugins.Adjoint, channels: int, rank: int) -> nn.Module:
    torch.manual_seed(0)
    return ih.Hamburger(channels, HAMS[ham](rank=rank, adjoint=adjoint), "v2")


def step(module: nn.Module, x: Tensor, training: bool) -> Callable[[], Tensor]:
    """One training step (forward, a loss, backward to x and the parameters) or, without
    ``training``, one forward pass without gradient."""
    x = x.clone().requires_grad_() if training else x

    def train() -> Tensor:
        module.zero_grad(set_to_none=True)
        x.grad = None
        torch.manual_seed(1)
        y = module(x)
        y.square().mean().backward()
        return y.detach()

    def evaluate() -> Tensor:
        torch.manual_seed(1)
        with torch.no_grad():
            return module(x)

    return train if training else evaluate


def cases(args: argparse.Namespace) -> dict[str, tuple[Callable[[], nn.Module], Tensor, bool]]:
    """name -> (module factory, input, training?): every ham's block and the tanh layer, in
    training under each of ``TRAIN_MODES`` and in evaluation."""
    gen = torch.Generator().manual_seed(0)
    image = torch.rand(args.batch, args.channels, args.size, args.size, generator=gen)
    vectors = torch.randn(args.batch * 8, args.width, generator=gen)
    variants = [(f"train, {mode}", adjoint, True) for mode, adjoint in TRAIN_MODES.items()]
    variants.append(("eval", ih.OneStep(), False))
    out: dict[str, tuple[Callable[[], nn.Module], Tensor, bool]] = {}
    for ham in args.hams:
        for label, adjoint, training in variants:
            ham_block = partial(block, ham, adjoint, args.channels, args.rank)
            out[f"{ham} block, {label}"] = (ham_block, image, training)
    for label, adjoint, training in variants:
        layer = partial(TanhLayer, args.width, args.steps, adjoint)
        out[f"fixed_point tanh, {label}"] = (layer, vectors, training)
    return out


def run(args: argparse.Namespace) -> Rows:
    """Time every case eager and compiled; the rows of the table (each printed as it is
    measured)."""
    inductor_config.fallback_random = True
    now = clock_seconds(args.clock)
    rows = Rows()
    for name, (factory, x, training) in cases(args).items():
        dynamo.reset()
        eager_module, compiled_module = _build(factory, training), _build(factory, training)
        compiled = torch.compile(compiled_module, backend=args.backend, fullgraph=True)
        eager = step(eager_module, x, training)
        fast = step(compiled, x, training)  # type: ignore[arg-type]
        start = now()
        reference = eager()
        eager_s = now() - start
        start = now()
        first = fast()
        compile_s = now() - start - eager_s
        times = interleaved_medians(
            {"eager": eager, "compiled": fast},
            torch.device("cpu"),
            args.repeats,
            args.warmup,
            args.clock,
        )
        rows.append(
            {
                "case": name,
                "eager_ms": times["eager"],
                "compiled_ms": times["compiled"],
                "speedup": times["eager"] / times["compiled"],
                "compile_s": compile_s,
                "max_abs_diff": float((first - reference).abs().max()),
            }
        )
        print(Rows(rows[-1:]), flush=True)
    return rows


def _build(factory: Callable[[], nn.Module], training: bool) -> nn.Module:
    """``factory()`` from seed 0 (both builds of a case get the same weights), in training or
    evaluation mode."""
    torch.manual_seed(0)
    return factory().train(training)


def graph_breaks(args: argparse.Namespace) -> Rows:
    """``torch._dynamo.explain`` of a block and of ``fixed_point`` under the at-point modes."""
    gen = torch.Generator().manual_seed(0)
    size = min(args.size, 8)  # a state small enough for Dense's max_size (its backward is traced)
    image = torch.rand(1, args.channels, size, size, generator=gen)
    vectors = torch.randn(4, args.width, generator=gen)
    rows = Rows()
    for mode, adjoint in {**TRAIN_MODES, **AT_POINT}.items():
        for what, module, x in (
            ("nmf block, train", block("nmf", adjoint, args.channels, args.rank), image),
            ("fixed_point tanh, train", TanhLayer(args.width, args.steps, adjoint), vectors),
        ):
            dynamo.reset()
            explanation = dynamo.explain(module)(x)
            reasons = sorted({_short(r.reason) for r in explanation.break_reasons})
            rows.append(
                {
                    "case": what,
                    "mode": mode,
                    "graphs": explanation.graph_count,
                    "graph_breaks": explanation.graph_break_count,
                    "reasons": "; ".join(reasons)[:90],
                }
            )
    return rows


def _short(reason: str) -> str:
    return reason.splitlines()[0].strip()


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hams", nargs="+", default=list(HAMS), choices=list(HAMS))
    parser.add_argument("--channels", type=int, default=64, help="block channels C")
    parser.add_argument("--size", type=int, default=16, help="H = W")
    parser.add_argument("--rank", type=int, default=8, help="r")
    parser.add_argument("--batch", type=int, default=2, help="images per step")
    parser.add_argument("--width", type=int, default=256, help="tanh layer width")
    parser.add_argument("--steps", type=int, default=30, help="K of the tanh fixed point")
    parser.add_argument("--backend", default="inductor", help="torch.compile backend")
    parser.add_argument("--repeats", type=int, default=15, help="timed rounds (median)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed rounds first")
    parser.add_argument("--clock", default="wall", choices=CLOCKS, help="wall or process CPU")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    parser.add_argument("--breaks-only", action="store_true", help="only count graph breaks")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> tuple[Rows, Rows]:
    args = parse_args(argv)
    threads = configure_threads(args.threads)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ih.ConvergenceWarning)
        warnings.simplefilter("ignore", ih.NotFixedPointWarning)
        breaks = graph_breaks(args)
        print(breaks, flush=True)
        rows = Rows() if args.breaks_only else run(args)
    if args.breaks_only:
        return rows, breaks
    print(
        f"torch {torch.__version__}, backend={args.backend}, threads={threads}, "
        f"clock={args.clock}, median of {args.repeats} interleaved rounds; blocks: "
        f"B={args.batch} C={args.channels} H=W={args.size} r={args.rank} (K=6 train, 7 eval); "
        f"tanh: B={args.batch * 8} width={args.width} K={args.steps}"
    )
    print(rows)
    print()
    print(breaks)
    return rows, breaks


if __name__ == "__main__":
    main()
