"""The library's loops against the same loops written bare, and against TorchOpt 0.7.3.

Two sections of the peer page (``docs/benchmarks_peers.md``), written as JSON rows in the format
of ``experiments.benchmarks.peers.run`` (``--json``):

* ``loops``: ``FixedPointIteration`` against a bare Python loop of the same ``f`` (a
  ``z = tanh(W z + x)`` map, B = 64, N = 256, and the NMF step of the README's problem), with a
  fixed budget (goal ours / bare <= 1.05) and with a tolerance (<= 1.15; the bare loop stops on
  the same worst-sample relative residual). The notes split ours' extra time into set-up,
  per-step bookkeeping and the end of the solve (``overhead_split``, an instrumented run).
  Needs only torch.
* ``torchopt``: the same algorithms in TorchOpt 0.7.3 (``torchopt.diff.implicit.custom_root``):
  a plain fixed-point forward with a 20-term Neumann backward, and 200 gradient-descent steps on
  a ridge problem with a CG backward (goal peer / ours >= 1.0). Runs where TorchOpt is installed
  (its own virtualenv, ``experiments/benchmarks/peers/venvs.sh``; run from this checkout's root with
  ``PYTHONPATH`` on it); skipped with a note otherwise.

Each case first checks that both sides compute the same value and gradient (``check_same``).

    PYTHONPATH=. .peers/torchopt/bin/python -m experiments.benchmarks.peers.loops \
        --json runs/1/loops.json
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor

import implicit_ham as ih
from experiments.benchmarks.peers.rows import (
    CLOCK,
    Table,
    _clock,
    check_same,
    medians,
    run_meta,
    write_json,
)

SECTIONS = ("loops", "torchopt")


def tanh_map(
    width: int = 256, batch: int = 64
) -> tuple[Callable[[Tensor, Tensor], Tensor], Tensor, Tensor]:
    """``f(z, x) = tanh(z W^T + x)`` with ``||W||_2 = 0.9``, its input x (B, N) and z0 = 0."""
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(width, width, generator=gen)
    weight = 0.9 * weight / torch.linalg.matrix_norm(weight, ord=2)
    x = torch.randn(batch, width, generator=gen)

    def f(z: Tensor, x: Tensor) -> Tensor:
        return torch.tanh(z @ weight.T + x)

    return f, x, torch.zeros(batch, width)


def bare_loop(
    f: Callable[..., Tensor], z0: Tensor, x: Tensor, steps: int, tol: float | None
) -> Callable[[], Tensor]:
    """A bare Python loop of ``f`` under no_grad; with ``tol`` it stops once the worst sample's
    relative residual ``||f(z) - z|| / ||f(z)||`` is ``<= tol`` (one host read per step)."""

    def run() -> Tensor:
        with torch.no_grad():
            z = z0
            for _ in range(steps):
                fz = f(z, x)
                if tol is not None:
                    worst = float(((fz - z).norm(dim=1) / fz.norm(dim=1)).max())
                    z = fz
                    if worst <= tol:
                        break
                else:
                    z = fz
        return z

    return run


def ours_loop(
    f: Callable[..., object], z0: object, x: Tensor, steps: int, tol: float | None
) -> Callable[[], object]:
    """``ih.fixed_point`` with ``FixedPointIteration(steps, tol)`` under no_grad."""
    solver = ih.FixedPointIteration(max_steps=steps, tol=tol)

    def run() -> object:
        with torch.no_grad():
            return ih.fixed_point(f, z0, x, solver=solver).value  # type: ignore[arg-type]

    return run


def overhead_split(
    f: Callable[..., Tensor], z0: Tensor, x: Tensor, steps: int, tol: float | None, rounds: int
) -> dict[str, float]:
    """Where ours' extra time goes: the medians (microseconds, wall clock) of ours minus the
    bare loop's before the first call of ``f`` (set-up), between the calls (each step's
    bookkeeping, summed over the steps) and after the last call (the end of the solve). Both
    sides call the same ``f`` wrapped in the same two ``perf_counter`` stamps, in interleaved
    rounds; this instrumented run is separate from the timed one."""
    stamps: list[float] = []

    def stamped(z: Tensor, inputs: Tensor) -> Tensor:
        stamps.append(time.perf_counter())
        out = f(z, inputs)
        stamps.append(time.perf_counter())
        return out

    runs = {
        "ours": ours_loop(stamped, z0, x, steps, tol),
        "bare": bare_loop(stamped, z0, x, steps, tol),
    }
    parts: dict[str, dict[str, list[float]]] = {
        name: {"set-up": [], "between steps": [], "end": []} for name in runs
    }
    for _ in range(rounds):
        for name, run in runs.items():
            stamps.clear()
            start = time.perf_counter()
            run()
            end = time.perf_counter()
            gaps = [stamps[i + 1] - stamps[i] for i in range(1, len(stamps) - 1, 2)]
            parts[name]["set-up"].append(stamps[0] - start)
            parts[name]["between steps"].append(sum(gaps))
            parts[name]["end"].append(end - stamps[-1])
    return {
        part: 1e6 * (statistics.median(parts["ours"][part]) - statistics.median(values))
        for part, values in parts["bare"].items()
    }


def nmf_step() -> tuple[Callable[..., tuple[Tensor, Tensor]], tuple[Tensor, Tensor], Tensor]:
    """The README's NMF problem (d 512, n 4096, r 64): its map, z0 and X."""
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(1, 512, 64, 64, generator=gen)
    bases = F.normalize(torch.rand(1, 512, 64, generator=gen), dim=1)
    problem = ih.NMF(rank=64).implicit_problem(x, init=bases)
    z0 = cast(tuple[Tensor, Tensor], tuple(t.detach() for t in problem.z0))
    layer = ih.NMF(rank=64)
    return (lambda z, x: tuple(layer.step(x, z))), z0, problem.args[0]  # type: ignore[return-value]


TANH_ROUNDS = 101  # the tanh cases take milliseconds: many rounds for a stable median


def measure_loops(table: Table, rounds: int, steps: int = 30, tol: float = 1e-6) -> None:
    f, x, z0 = tanh_map()
    for budget, stop in ((steps, None), (200, tol)):
        ours, bare = ours_loop(f, z0, x, budget, stop), bare_loop(f, z0, x, budget, stop)
        # with a tolerance ours freezes each sample at its own stop, the bare loop stops the
        # batch on the worst one: the values differ by about the tolerance
        agree = check_same(
            "tanh loop", [cast(Tensor, ours())], [bare()], 0.0 if stop is None else 10 * stop
        )
        times = medians({"ours": ours, "bare": bare}, max(rounds, TANH_ROUNDS))
        goal, what = (1.05, f"K {budget}") if stop is None else (1.15, f"tol {stop:g}")
        split = overhead_split(f, z0, x, budget, stop, max(rounds, 30))
        where = ", ".join(f"{part} {value:+.0f}" for part, value in split.items())
        table.add_at_most(
            "7. fixed-point loop overhead",
            f"tanh B64 N256, {what}",
            "bare Python loop",
            times["ours"],
            times["bare"],
            goal,
            f"ratio = ours / bare, {max(rounds, TANH_ROUNDS)} rounds; values agree to "
            f"{agree:.0e}; ours - bare in µs (wall, "
            f"instrumented run): {where}",
        )
    step, state, flat = nmf_step()

    def bare_nmf() -> tuple[Tensor, Tensor]:
        with torch.no_grad():
            z = state
            for _ in range(6):
                z = step(z, flat)
        return z

    ours_nmf = ours_loop(step, state, flat, 6, None)
    check_same("NMF loop", list(cast(tuple[Tensor, Tensor], ours_nmf())), list(bare_nmf()), 0.0)
    times = medians({"ours": ours_nmf, "bare": bare_nmf}, rounds)
    table.add_at_most(
        "7. fixed-point loop overhead",
        "NMF step d512 n4096 r64, K 6",
        "bare Python loop",
        times["ours"],
        times["bare"],
        1.05,
        "ratio = ours / bare; same iterates (checked bitwise)",
    )


def torchopt_cases(
    steps: int = 30, terms: int = 20
) -> tuple[Callable[[], Tensor], Callable[[], Tensor]]:
    """(ours, TorchOpt) training steps on the tanh map: ``steps`` plain iterations, then a
    ``terms``-term Neumann series for ``(I - J)^-T``; each returns dL/dx, L = sum(z*^2)."""
    torchopt = importlib.import_module("torchopt")
    f, x_data, z0 = tanh_map()
    adjoint = ih.Neumann(k=terms, tau=1.0)
    solver = ih.FixedPointIteration(max_steps=steps)

    def ours() -> Tensor:
        x = x_data.clone().requires_grad_()
        sol = ih.fixed_point(f, z0, x, solver=solver, adjoint=adjoint)
        cast(Tensor, sol.value).square().sum().backward()
        return cast(Tensor, x.grad)

    def optimality(z: Tensor, x: Tensor) -> Tensor:
        return z - f(z, x)

    @torchopt.diff.implicit.custom_root(
        optimality, argnums=1, solve=torchopt.linear_solve.solve_inv(ns=True, maxiter=terms)
    )
    def solve(z: Tensor, x: Tensor) -> Tensor:
        with torch.no_grad():
            for _ in range(steps):
                z = f(z, x)
        return z

    def peer() -> Tensor:
        x = x_data.clone().requires_grad_()
        solve(z0, x).square().sum().backward()
        return cast(Tensor, x.grad)

    return ours, peer


def ridge_cases(
    steps: int = 200, cg_steps: int = 20
) -> tuple[Callable[[], Tensor], Callable[[], Tensor]]:
    """(ours, TorchOpt) on ``argmin_z 0.5 ||A z - x||^2 + 0.5 lam ||z||^2`` (B 64, 128 x 64):
    ``steps`` gradient-descent steps forward, ``cg_steps`` CG iterations on the Hessian
    backward; each returns dL/dx, L = sum(z*^2)."""
    torchopt = importlib.import_module("torchopt")
    gen = torch.Generator().manual_seed(5)
    mat = torch.randn(128, 64, generator=gen) / 128**0.5
    x_data = torch.randn(64, 128, generator=gen)
    lam, lr = 0.1, 0.5
    z0 = torch.zeros(64, 64)

    def loss(z: Tensor, x: Tensor) -> Tensor:
        return 0.5 * (z @ mat.T - x).square().sum() + 0.5 * lam * z.square().sum()

    solver = ih.GradientDescent(lr=lr, max_steps=steps, tol=None)
    adjoint = ih.Implicit(
        linear_solver="cg",
        max_steps=cg_steps,
        tol=1e-12,
        fixed_point_tol=None,
        on_divergence="warn",
        scaling=False,  # the peer's plain CG, product for product
    )

    def ours() -> Tensor:
        x = x_data.clone().requires_grad_()
        sol = ih.minimize(loss, z0, x, solver=solver, adjoint=adjoint)
        cast(Tensor, sol.value).square().sum().backward()
        return cast(Tensor, x.grad)

    optimality = torch.func.grad(loss)  # the gradient by autograd, as the library takes it

    @torchopt.diff.implicit.custom_root(
        optimality,
        argnums=1,
        solve=torchopt.linear_solve.solve_cg(maxiter=cg_steps, rtol=1e-12, atol=0.0),
    )
    def solve(z: Tensor, x: Tensor) -> Tensor:
        x = x.detach()
        for _ in range(steps):
            z = z - lr * optimality(z, x)
        return z.detach()

    def peer() -> Tensor:
        x = x_data.clone().requires_grad_()
        solve(z0, x).square().sum().backward()
        return cast(Tensor, x.grad)

    return ours, peer


def measure_torchopt(table: Table, rounds: int) -> None:
    try:
        torchopt = importlib.import_module("torchopt")
    except ImportError:
        print(
            "peers_loops: TorchOpt is not installed here; run this section in .peers/torchopt",
            file=sys.stderr,
        )
        return
    version = torchopt.__version__
    for case, (ours, peer) in (
        ("fixed point K30 + 20-term Neumann, tanh B64 N256", torchopt_cases()),
        ("200 GD steps + 20 CG steps, ridge B64 128x64", ridge_cases()),
    ):
        agree = check_same(f"TorchOpt {case}", [ours()], [peer()], 1e-4)
        times = medians({"ours": ours, "peer": peer}, rounds)
        table.add(
            "8. same-algorithm loop, training step",
            case,
            f"TorchOpt {version} custom_root",
            times["ours"],
            times["peer"],
            1.0,
            f"rel. diff of dL/dx {agree:.1e}",
        )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds (median)")
    parser.add_argument("--only", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--clock", choices=list(CLOCK), default="cpu", help="process CPU or wall")
    parser.add_argument("--json", default=None, help="write the rows here (JSON row format)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> Table:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    _clock[0] = CLOCK[args.clock]
    warnings.simplefilter("ignore", ih.ConvergenceWarning)
    table = Table()
    if "loops" in args.only:
        measure_loops(table, args.rounds)
    if "torchopt" in args.only:
        measure_torchopt(table, args.rounds)
    print(table.markdown())
    if args.json:
        words = sys.argv[1:] if argv is None else list(argv)
        command = " ".join(["python -m experiments.benchmarks.peers.loops", *words])
        write_json(
            args.json, "loops", table, run_meta(command, args.threads, args.clock, args.rounds)
        )
    return table


if __name__ == "__main__":
    main()
