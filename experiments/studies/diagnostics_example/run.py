"""Worked example of the diagnostics on small float64 problems (CPU, a few seconds).

1. ``compare_adjoints`` on a tanh DEQ layer ``z = tanh(W z + U x)``: every backward mode's
   gradient against the exact (dense implicit) one.
2. Conditioning at the fixed point of that layer, and of Hamburger's NMF map, whose scaling
   symmetry makes ``I - J`` nearly singular (``check_conditioning`` warns).
3. Convergence of three forward solvers, and the gradient as a function of K per mode.
4. A figure with the residual traces and the gradient-vs-K curves: docs/diagnostics_example.png.

    python -m experiments.studies.diagnostics_example.run [--out docs/diagnostics_example.png]
"""

from __future__ import annotations

import argparse
import logging
import warnings
from pathlib import Path

import torch
from matplotlib.figure import Figure

import implicit_ham as ih
from implicit_ham.diagnostics import (
    check_conditioning,
    compare_adjoints,
    convergence_rows,
    format_table,
    grad_vs_k,
    plot_grad_vs_k,
    plot_residuals,
)

F64 = torch.float64


def deq_problem(seed: int = 0, batch: int = 4, width: int = 16) -> ih.FixedPointProblem:
    """z = tanh(W z + U x) with ||W||_2 = 0.9 (a contraction), x and W requiring grad."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(width, width, dtype=F64, generator=gen)
    w = (0.9 * w / torch.linalg.matrix_norm(w, ord=2)).requires_grad_()
    u = torch.randn(width, width, dtype=F64, generator=gen) / width**0.5
    x = torch.randn(batch, width, dtype=F64, generator=gen).requires_grad_()

    def f(z: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.tanh(z @ w.T + x @ u.T)

    return ih.FixedPointProblem(f, torch.zeros(batch, width, dtype=F64), (x, w))


def nmf_problem(seed: int = 0, d: int = 8, n: int = 12, r: int = 2) -> ih.FixedPointProblem:
    """Hamburger's NMF multiplicative updates on a random non-negative X (B=1, d x n, rank r)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(1, d, n, dtype=F64, generator=gen)

    def step(z: tuple[torch.Tensor, torch.Tensor], x: torch.Tensor):
        bases, coef = z
        coef = coef * (x.transpose(1, 2) @ bases) / (coef @ (bases.transpose(1, 2) @ bases) + 1e-6)
        bases = bases * (x @ coef) / (bases @ (coef.transpose(1, 2) @ coef) + 1e-6)
        return bases, coef

    z0 = (
        torch.rand(1, d, r, dtype=F64, generator=gen),
        torch.rand(1, n, r, dtype=F64, generator=gen),
    )
    return ih.FixedPointProblem(step, z0, (x,))


def loss_fn(z: torch.Tensor) -> torch.Tensor:
    """A fixed random linear read-out, squared."""
    target = torch.linspace(-1, 1, z.shape[-1], dtype=z.dtype)
    return ((z - target) ** 2).sum()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/diagnostics_example.png", help="PNG path")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    problem = deq_problem()
    solver = ih.FixedPointIteration(max_steps=300, tol=1e-12)

    def layer(adjoint: ih.plugins.Adjoint, x: torch.Tensor, w: torch.Tensor) -> ih.Solution:
        # the Solution, not its value: its backward_log lets the reference's "why" quote numbers
        return ih.fixed_point(problem.f, problem.z0, x, w, solver=solver, adjoint=adjoint)

    modes = [
        ih.Unroll(),
        ih.Truncated(k=5),
        ih.OneStep(),
        ih.Phantom(k=5, tau=0.5),
        ih.Neumann(k=10, tau=0.8),
        ih.Implicit(linear_solver="gmres", tol=1e-10),
    ]
    fidelity = compare_adjoints(layer, problem.args, lambda s: loss_fn(s.value), modes, repeats=3)
    print("== gradient fidelity ==")
    shown = ["adjoint", "reference", "cosine", "rel_error", "norm_ratio", "grad_norm"]
    print(format_table(fidelity, [*shown, "backward_ms", "saved_bytes", "same_forward"]))
    print(f"reference: {fidelity[0]['why']}")

    print("\n== conditioning at the fixed point ==")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ih.ConditioningWarning)
        deq = check_conditioning(problem, solver=solver)
        nmf = check_conditioning(nmf_problem(), solver=ih.FixedPointIteration(max_steps=2000))
    columns = ["spectral_radius", "sigma_max", "sigma_min", "kappa", "fixed_point_residual"]
    rows: list[dict[str, float | int | str]] = [
        {"problem": "tanh DEQ", **{k: deq.as_dict()[k] for k in columns}},
        {"problem": "NMF (d=8, n=12, r=2)", **{k: nmf.as_dict()[k] for k in columns}},
    ]
    print(format_table(rows))
    for w in caught:
        print(f"{w.category.__name__}: {w.message}")

    print("\n== forward solvers ==")
    solvers = {
        "fixed_point": ih.FixedPointIteration(max_steps=300, tol=1e-10),
        "anderson": ih.Anderson(max_steps=100, tol=1e-10),
        "broyden": ih.Broyden(max_steps=100, tol=1e-10),
    }
    conv, traces = convergence_rows(problem, solvers, tol=1e-8)
    print(conv)

    print("\n== gradient vs K (FixedPointIteration(max_steps=K)) ==")
    per_k = grad_vs_k(
        problem,
        loss_fn,
        [1, 2, 4, 8, 16, 32],
        {"unroll": ih.Unroll(), "one_step": ih.OneStep(), "phantom(5, 0.5)": ih.Phantom(5, 0.5)},
    )
    print(per_k)

    fig = Figure(figsize=(13, 3.6), layout="constrained")
    residual_ax, norm_ax, cosine_ax = fig.subplots(1, 3)
    plot_residuals(traces, ax=residual_ax)
    plot_grad_vs_k(per_k, axes=(norm_ax, cosine_ax))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
