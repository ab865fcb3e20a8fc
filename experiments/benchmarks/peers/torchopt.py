"""``ih.minimize`` side by side with TorchOpt 0.7.3's implicit differentiation (issue 25).

Two problems from TorchOpt's own tests (``tests/test_implicit.py``), each timed as one call of
the layer, the outer loss and its hypergradient (``torch.autograd.grad``), both libraries at
their defaults:

* ``ridge``: ``test_rr_solve_cg``'s problem, ``w* = argmin ½ mean((X w - y)²) + ½ λ ||w||²``
  on one 1024 × 10 batch (seed 42), outer loss ``mse(X_q w*, y_q)``, hypergradient in λ.
  TorchOpt: ``custom_root(grad(objective), argnums=1)`` around ``solve_cg(ridge=n λ,
  init=w0, maxiter=20)`` exactly as in its test; ours: ``ih.minimize(loss, w0, λ, X, y)``
  (L-BFGS, implicit CG backward).
* ``imaml_logistic``: ``test_imaml_solve_normal_cg``'s problem, a linear 10-class softmax
  model (weights ones, bias zeros) on 8 samples (x standard normal, seed 42), inner problem
  ``CE(f(θ, x), y) + ½ ||θ - φ||²``, outer loss ``mean f(θ*, x)``, hypergradient in φ.
  TorchOpt: its test's inner loop (``torchopt.sgd``) with ``solve_normal_cg``; the loop runs
  40 steps at lr 0.4 (the test's 20-100 steps at lr 2e-2 stop far from the minimum, so the
  two sides would not agree; 0.6^40 ≈ 1e-9 contraction here); ours: ``ih.minimize`` over
  ``ih.module_state(model)`` with ``ih.call_module``.

Before timing, both sides are checked to agree: the outer values and hypergradients within
1e-6 (float64) / 1e-4 (float32) relative to the largest entry. Every ratio is TorchOpt time /
ours (above 1: this library is faster), medians of interleaved rounds on one thread. This is a
benchmark, not a test: it needs the TorchOpt virtualenv
(``experiments/benchmarks/peers/venvs.sh``)::

    PYTHONPATH=. .peers/torchopt/bin/python -m experiments.benchmarks.peers.torchopt \\
        --json /tmp/torchopt.json
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import implicit_ham as ih
from experiments.benchmarks.measure import interleaved_medians
from experiments.benchmarks.peers.rows import Table, run_meta

GOAL = 1.1
TARGET = "issue 25: minimize vs TorchOpt"
LOG = logging.getLogger(__name__)

Run = Callable[[], tuple[Tensor, tuple[Tensor, ...]]]


@dataclass(frozen=True)
class Case:
    """One problem, both sides: each returns (outer value, hypergradients)."""

    name: str
    ours: Run
    theirs: Run


def ridge(dtype: torch.dtype) -> Case:
    """TorchOpt's test_rr_solve_cg problem (first loader batch)."""
    import torchopt  # type: ignore[import-not-found]  # the peer's virtualenv only

    torch.manual_seed(42)
    w0 = torch.randn(10, dtype=dtype)
    l2reg = torch.rand(1, dtype=dtype).squeeze_().requires_grad_(True)
    torch.manual_seed(42)
    xs, ys, xq, yq = (torch.randn(1024, 10), torch.randn(1024), torch.randn(1024, 10),
                      torch.randn(1024))  # fmt: skip
    xs, ys, xq, yq = (t.to(dtype) for t in (xs, ys, xq, yq))

    def objective(params: Tensor, lam: Tensor, data: tuple[Tensor, Tensor]) -> Tensor:
        x, y = data
        residuals = x @ params - y
        return 0.5 * torch.mean(torch.square(residuals)) + 0.5 * lam * torch.sum(params**2)

    @torchopt.diff.implicit.custom_root(torch.func.grad(objective, argnums=0), argnums=1)
    def solver_cg(params: Tensor, lam: Tensor, data: tuple[Tensor, Tensor]) -> Tensor:
        x, y = data
        solve = torchopt.linear_solve.solve_cg(ridge=len(y) * lam.item(), init=params,
                                               maxiter=20)  # fmt: skip
        return solve(matvec=lambda u: x.T @ (x @ u), b=x.T @ y)

    def theirs() -> tuple[Tensor, tuple[Tensor, ...]]:
        w = solver_cg(w0, l2reg, (xs, ys))
        outer = F.mse_loss(xq @ w, yq)
        return outer.detach(), torch.autograd.grad(outer, l2reg)

    def loss(w: Tensor, lam: Tensor, x: Tensor, y: Tensor) -> Tensor:
        return objective(w[0], lam, (x, y))

    def ours() -> tuple[Tensor, tuple[Tensor, ...]]:
        w = ih.minimize(loss, w0[None], l2reg, xs, ys).value
        outer = F.mse_loss(xq @ w[0], yq)
        return outer.detach(), torch.autograd.grad(outer, l2reg)

    return Case("ridge", ours, theirs)


def imaml_logistic(dtype: torch.dtype) -> Case:
    """TorchOpt's test_imaml_solve_normal_cg problem with a converging inner loop."""
    import torchopt

    torch.manual_seed(42)
    x = torch.randn(8, 10, dtype=dtype)
    y = torch.randint(0, 10, (8,))
    model = nn.Linear(10, 10).to(dtype)
    with torch.no_grad():
        model.weight.fill_(1.0)
        model.bias.zero_()
    meta = tuple(p.detach().clone().requires_grad_() for p in model.parameters())

    def f(params: tuple[Tensor, ...], inputs: Tensor) -> Tensor:
        return inputs @ params[0].T + params[1]

    def objective(params: tuple[Tensor, ...], meta_params: tuple[Tensor, ...]) -> Tensor:
        prox = sum(0.5 * torch.sum((p - q) ** 2) for p, q in zip(params, meta_params, strict=True))
        return F.cross_entropy(f(params, x), y) + prox

    @torchopt.diff.implicit.custom_root(
        torch.func.grad(objective, argnums=0), argnums=1,
        solve=torchopt.linear_solve.solve_normal_cg(),
    )  # fmt: skip
    def inner(params: tuple[Tensor, ...], meta_params: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
        optimizer = torchopt.sgd(lr=0.4)
        state = optimizer.init(params)
        with torch.enable_grad():
            for _ in range(40):
                grads = torch.autograd.grad(objective(params, meta_params), params)
                updates, state = optimizer.update(grads, state, inplace=True)
                params = torchopt.apply_updates(params, updates, inplace=True)
        return params

    def theirs() -> tuple[Tensor, tuple[Tensor, ...]]:
        start = tuple(p.detach().clone().requires_grad_() for p in meta)
        outer = f(inner(start, meta), x).mean()
        return outer.detach(), torch.autograd.grad(outer, meta)

    names = [name for name, _ in model.named_parameters()]

    def loss(theta: dict[str, Tensor], phi: tuple[Tensor, ...]) -> Tensor:
        logits = ih.call_module(model, theta, x[None])[0]
        prox = sum(0.5 * torch.sum((theta[k] - p) ** 2) for k, p in zip(names, phi, strict=True))
        return F.cross_entropy(logits, y) + prox

    def ours() -> tuple[Tensor, tuple[Tensor, ...]]:
        theta = cast(dict[str, Tensor], ih.minimize(loss, ih.module_state(model), meta).value)
        outer = ih.call_module(model, theta, x[None]).mean()
        return outer.detach(), torch.autograd.grad(outer, meta)

    return Case("imaml_logistic", ours, theirs)


def agree(case: Case, dtype: torch.dtype) -> str:
    """Check that both sides give the same outer value and hypergradients (raise otherwise);
    returns the largest relative difference, for the notes."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", ih.ConvergenceWarning)
        warnings.simplefilter("error", ih.NotFixedPointWarning)
        ours_value, ours_grads = case.ours()
    theirs_value, theirs_grads = case.theirs()
    tol = 1e-6 if dtype == torch.float64 else 1e-4
    worst = 0.0
    for a, b in zip((ours_value, *ours_grads), (theirs_value, *theirs_grads), strict=True):
        scale = float(b.abs().max().clamp_min(1e-12))
        worst = max(worst, float((a - b).abs().max()) / scale)
    if worst > tol:
        raise AssertionError(
            f"{case.name} ({dtype}): the two sides disagree by {worst:.2e} (relative) > {tol:g}"
        )
    return f"agree to {worst:.1e} (relative)"


def measure(repeats: int, warmup: int) -> list[dict[str, object]]:
    """The rows: both problems in float32 and float64."""
    table = Table()
    for dtype in (torch.float32, torch.float64):
        for build in (ridge, imaml_logistic):
            case = build(dtype)
            note = agree(case, dtype)
            times = interleaved_medians(
                {"ours": case.ours, "theirs": case.theirs}, torch.device("cpu"), repeats, warmup
            )
            name = f"{case.name} {str(dtype).removeprefix('torch.')}"
            table.add(TARGET, name, "TorchOpt 0.7.3", times["ours"], times["theirs"], GOAL,
                      f"defaults; {note}")  # fmt: skip
            LOG.info("%s: ours %.3f ms, TorchOpt %.3f ms, ratio %.2f", name, times["ours"],
                     times["theirs"], table.rows[-1]["ratio"])  # fmt: skip
    return table.rows


def main(argv: list[str] | None = None) -> int:
    """Measure, log each row, and write the rows as JSON when ``--json`` is given."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, default=None, help="write the rows here")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(args.threads)
    rows = measure(args.repeats, args.warmup)
    if args.json is not None:
        command = " ".join(
            ["python -m experiments.benchmarks.peers.torchopt", *(argv or sys.argv[1:])]
        )
        meta = run_meta(command, args.threads, "wall", args.repeats)
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps({"section": "torchopt", "meta": meta, "rows": rows}, indent=1)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
