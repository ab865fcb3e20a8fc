"""The Theseus 0.2.3 section of the peer page: batched nonlinear least squares with an implicit
gradient, ``ih.least_squares`` against ``theseus.TheseusLayer``, in one process.

Theseus's curve-fitting problem: fit ``y = exp(a x + b)`` to 100 points per sample, B samples
(one (a, b) each), from (0, 0), by Gauss-Newton or Levenberg-Marquardt, each library at its
defaults (Theseus: ``AutoDiffCostFunction``, ``max_iterations=20``, its error tolerances;
``backward_mode="implicit"``), then the gradient of ``Σ w · (a*, b*)`` with respect to the data
y. One thread, interleaved rounds, medians; ratio = Theseus time / ours (above 1: ours is
faster). A last row per dtype is ours at B = 64 over ours at B = 1 (goal <= 4).

Before timing, each case checks that both sides agree (``SystemExit`` naming the case when they
do not): the minimisers on the timed data (noise 0.01) within 1e-6 (float64) / 1e-4 (float32);
our gradient against a dense float64 implicit-function-theorem reference (full Hessian) within
1e-6 (float64) / 1e-4 (float32), relative to its largest entry; and both gradients on the same
problem without noise, where Theseus's Gauss-Newton-Hessian gradient is exact too, within 1e-6
/ 1e-3. On the noisy data Theseus's gradient differs from the exact one by the residual term of
the Hessian it leaves out; the notes give that gap.

Needs Theseus (``experiments/benchmarks/peers/venvs.sh`` makes ``.peers/theseus``); never run by
the tests:

    PYTHONPATH=. .peers/theseus/bin/python -m experiments.benchmarks.peers.theseus \\
        --json runs/1/theseus.json

The JSON file follows the row format of ``experiments.benchmarks.peers.run`` (``section``,
``meta``, ``rows`` with the columns target, case, peer, ours_ms, peer_ms, ratio, goal, met,
notes).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

import implicit_ham as ih
from experiments.benchmarks.measure import interleaved_medians
from experiments.benchmarks.peers.rows import Table, write_json

TARGET = "25.1 batched least squares, implicit gradient"
SCALING = "25.1 least squares: time(B=64) / time(B=1)"
PEER = "Theseus 0.2.3"
POINTS = 100
VALUE_TOL = {torch.float64: 1e-6, torch.float32: 1e-4}
GRADIENT_TOL = {torch.float64: 1e-6, torch.float32: 1e-4}
AGREE_TOL = {torch.float64: 1e-6, torch.float32: 1e-3}


def data(batch: int, dtype: torch.dtype, noise: float) -> tuple[Tensor, Tensor, Tensor]:
    """x (B, 100), y (B, 100) and the weights w (B, 2) of the outer loss, made in float64."""
    gen = torch.Generator().manual_seed(batch)
    x = torch.linspace(0, 1, POINTS, dtype=torch.float64).expand(batch, POINTS).clone()
    a = 0.5 + torch.rand(batch, 1, generator=gen, dtype=torch.float64)
    b = torch.rand(batch, 1, generator=gen, dtype=torch.float64)
    noisy = noise * torch.randn(batch, POINTS, generator=gen, dtype=torch.float64)
    y = torch.exp(a * x + b) + noisy
    w = torch.randn(batch, 2, generator=gen, dtype=torch.float64)
    return x.to(dtype), y.to(dtype), w.to(dtype)


def residuals(p: Tensor, x: Tensor, y: Tensor) -> Tensor:
    """(B, 100): exp(a x + b) - y."""
    return torch.exp(p[:, :1] * x + p[:, 1:]) - y


Run = Callable[[Tensor], tuple[Tensor, Tensor]]


def ours(solver: str, x: Tensor, w: Tensor) -> Run:
    """y -> (minimiser, dL/dy) with ``ih.least_squares`` at its defaults."""
    method = ih.GaussNewton() if solver == "GN" else ih.LevenbergMarquardt()

    def run(y: Tensor) -> tuple[Tensor, Tensor]:
        y = y.detach().requires_grad_()
        value = ih.least_squares(residuals, torch.zeros_like(w), x, y, solver=method).value
        assert isinstance(value, Tensor)
        (grad,) = torch.autograd.grad((value * w).sum(), y)
        return value.detach(), grad

    return run


def theseus(solver: str, x: Tensor, w: Tensor) -> Run:
    """The same with a ``TheseusLayer`` (built once, as a user would)."""
    import theseus as th  # type: ignore[import-not-found]  # its own virtualenv only

    dtype, batch = x.dtype, x.shape[0]
    ab = th.Vector(2, name="ab", dtype=dtype)
    xv = th.Variable(x, name="x")
    yv = th.Variable(torch.zeros_like(x), name="y")

    def error(optim_vars: Any, aux_vars: Any) -> Tensor:
        return residuals(optim_vars[0].tensor, aux_vars[0].tensor, aux_vars[1].tensor)

    objective = th.Objective(dtype=dtype)
    weight = th.ScaleCostWeight(torch.tensor(1.0, dtype=dtype))
    objective.add(th.AutoDiffCostFunction([ab], error, POINTS, aux_vars=[xv, yv],
                                          cost_weight=weight, name="fit"))  # fmt: skip
    method = th.GaussNewton if solver == "GN" else th.LevenbergMarquardt
    layer = th.TheseusLayer(method(objective))
    zeros = torch.zeros(batch, 2, dtype=dtype)

    def run(y: Tensor) -> tuple[Tensor, Tensor]:
        y = y.detach().requires_grad_()
        solution, _ = layer.forward(
            {"x": x, "y": y, "ab": zeros}, optimizer_kwargs={"backward_mode": "implicit"}
        )
        (grad,) = torch.autograd.grad((solution["ab"] * w).sum(), y)
        return solution["ab"].detach(), grad

    return run


def reference_gradient(p: Tensor, x: Tensor, y: Tensor, w: Tensor) -> Tensor:
    """dL/dy by the implicit-function theorem with the full Hessian, per sample, float64."""
    p, x, y, w = (t.double() for t in (p, x, y, w))

    def cost(q: Tensor, xs: Tensor, ys: Tensor) -> Tensor:
        return 0.5 * (torch.exp(q[0] * xs + q[1]) - ys).square().sum()

    rows = []
    for q, xs, ys, ws in zip(p, x, y, w, strict=True):
        hess = torch.func.hessian(cost)(q, xs, ys)
        cross = torch.func.jacrev(torch.func.grad(cost), argnums=2)(q, xs, ys)
        rows.append(-cross.T @ torch.linalg.solve(hess, ws))
    return torch.stack(rows)


def relative(a: Tensor, b: Tensor) -> float:
    """max |a - b| / max |b|, in float64."""
    a, b = a.double(), b.double()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


def check(case: str, solver: str, batch: int, dtype: torch.dtype) -> str:
    """The agreement checks of the module docstring; returns the note on Theseus's gradient."""
    x, y, w = data(batch, dtype, noise=0.01)
    mine, theirs = ours(solver, x, w)(y), theseus(solver, x, w)(y)
    value_gap = float((mine[0] - theirs[0]).abs().max())
    reference = reference_gradient(mine[0], x, y, w)
    ours_gap, theirs_gap = relative(mine[1], reference), relative(theirs[1], reference)
    x0, y0, w0 = data(batch, dtype, noise=0.0)
    clean = relative(ours(solver, x0, w0)(y0)[1], theseus(solver, x0, w0)(y0)[1])
    failures = [
        f"minimisers differ by {value_gap:.2e}" if value_gap > VALUE_TOL[dtype] else "",
        f"our gradient is {ours_gap:.2e} off the float64 reference"
        if ours_gap > GRADIENT_TOL[dtype] else "",
        f"the gradients differ by {clean:.2e} without noise" if clean > AGREE_TOL[dtype] else "",
    ]  # fmt: skip
    failed = [f for f in failures if f]
    if failed:
        raise SystemExit(f"peers_theseus: {case}: {'; '.join(failed)}")
    return (
        f"minimisers agree to {value_gap:.1e}; gradient vs float64 IFT: ours {ours_gap:.1e}, "
        f"Theseus {theirs_gap:.1e} (its Gauss-Newton Hessian); no-noise agreement {clean:.1e}"
    )


def measure(rounds: int, batches: tuple[int, ...], solvers: tuple[str, ...]) -> Table:
    """Every case's row (module docstring)."""
    table = Table()
    for dtype in (torch.float64, torch.float32):
        for solver in solvers:
            ours_ms: dict[int, float] = {}
            for batch in batches:
                name = str(dtype).removeprefix("torch.")
                case = f"exp(a x + b), {POINTS} points, B={batch}, {name}, {solver}"
                notes = check(case, solver, batch, dtype)
                x, y, w = data(batch, dtype, noise=0.01)
                runs = {"ours": ours(solver, x, w), "peer": theseus(solver, x, w)}
                cases = {k: partial(run, y) for k, run in runs.items()}
                times = interleaved_medians(cases, torch.device("cpu"), repeats=rounds, warmup=1)
                ours_ms[batch] = times["ours"]
                table.add(TARGET, case, PEER, times["ours"], times["peer"], 1.1, notes)
                print(json.dumps(table.rows[-1]), file=sys.stderr)
            if 1 in ours_ms and 64 in ours_ms:
                case = f"{str(dtype).removeprefix('torch.')}, {solver}"
                note = "ours_ms: B=64, peer_ms: ours at B=1, same run"
                table.add_at_most(SCALING, case, "ours at B=1", ours_ms[64], ours_ms[1], 4, note)
    return table


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--solvers", nargs="+", default=["GN", "LM"], choices=["GN", "LM"])
    parser.add_argument("--json", type=Path, help="write the rows in the peer JSON format")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore", DeprecationWarning)
    table = measure(args.rounds, tuple(args.batches), tuple(args.solvers))
    meta = {
        "command": " ".join(sys.argv),
        "torch": torch.__version__,
        "threads": args.threads,
        "clock": "wall",  # interleaved_medians' default, as the call above
        "rounds": args.rounds,
        "load": f"load average: {', '.join(f'{v:.2f}' for v in os.getloadavg())}",
        "python": sys.executable,
    }
    if args.json is not None:
        write_json(args.json, "theseus", table, meta)
    for r in table.rows:
        print(f"{r['case']:<48} ours {r['ours_ms']:8.2f} ms  peer {r['peer_ms']:8.2f} ms  "
              f"ratio {r['ratio']:.2f} ({r['goal']}: {r['met']})")  # fmt: skip


if __name__ == "__main__":
    main()
