"""One backward GMRES solve on the README's NMF problem against the previous, stacked-basis GMRES
of this library (``StackedGMRES``, kept here for the comparison): section ``gmres`` of
``experiments.benchmarks.peers.run``."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

import implicit_ham as ih
from experiments.benchmarks.peers.rows import (
    Table,
    medians,
)
from implicit_ham.linalg.operator import AdjointOperator, LinearSolve, LinearSolver
from implicit_ham.plugins import StateSpec


class StackedGMRES(LinearSolver):
    """The library's previous GMRES, kept as the reference of target 3: the basis a Python
    list, stacked four times per Arnoldi step, a ``torch.linalg.lstsq`` per step and two host
    reads per step."""

    restart = 30

    def solve(self, op: AdjointOperator, v: Tensor, max_steps: int, tol: float) -> LinearSolve:
        def matvec(x: Tensor) -> Tensor:
            return x - op.vjp(x)

        x = torch.zeros_like(v)
        target = tol * float(torch.linalg.vector_norm(v))
        r, steps = v, 0
        while steps < max_steps:
            beta = float(torch.linalg.vector_norm(r))
            if beta <= target or beta == 0.0:
                break
            y, basis, hess, converged = self._cycle(matvec, r, beta, target, max_steps - steps)
            steps += hess.shape[1]
            x = x + basis.T @ y
            if converged or steps >= max_steps:
                break
            r = v - matvec(x)
            steps += 1
        return LinearSolve(x, steps, None)

    def _cycle(
        self, matvec: Callable[[Tensor], Tensor], r: Tensor, beta: float, target: float, budget: int
    ) -> tuple[Tensor, Tensor, Tensor, bool]:
        dim = min(self.restart, budget)
        basis = [r / beta]
        hess = torch.zeros(dim + 1, dim, dtype=r.dtype)
        rhs = torch.zeros(dim + 1, dtype=r.dtype)
        rhs[0] = beta
        y = rhs[:0]
        for j in range(dim):
            w = matvec(basis[j])
            for _ in range(2):
                coeffs = torch.stack(basis) @ w
                w = w - torch.stack(basis).T @ coeffs
                hess[: j + 1, j] += coeffs
            hess[j + 1, j] = torch.linalg.vector_norm(w)
            h = hess[: j + 2, : j + 1]
            y = torch.linalg.lstsq(h, rhs[: j + 2, None], driver="gels").solution[:, 0]
            residual = float(torch.linalg.vector_norm(h @ y - rhs[: j + 2]))
            if residual <= target or float(hess[j + 1, j]) <= 1e-14 * beta:
                return y, torch.stack(basis), h, residual <= target
            basis.append(w / hess[j + 1, j])
        return y, torch.stack(basis[:dim]), hess, False


def readme_nmf_operator() -> tuple[AdjointOperator, Tensor]:
    """J^T of the README's NMF problem (``ih.NMF(rank=64).implicit_problem(x)``, d = 512,
    n = 4096, K = 6 steps) at its 6-step solution, and an incoming gradient v."""
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(1, 512, 64, 64, generator=gen)
    bases = F.normalize(torch.rand(1, 512, 64, generator=gen), dim=1)
    problem = ih.NMF(rank=64).implicit_problem(x, init=bases)
    with torch.no_grad():
        sol = problem.solve(ih.FixedPointIteration(max_steps=6), ih.OneStep())
    spec = StateSpec.of(problem.z0)
    z = tuple(t.detach().requires_grad_() for t in sol.value)
    fz = problem.f(z, *problem.args)

    def vjp(g: Tensor) -> Tensor:
        grads = torch.autograd.grad(fz, z, spec.unflatten(g), retain_graph=True)
        return spec.flatten(grads).reshape(-1)

    size = spec.flatten(z).numel()
    op = AdjointOperator(vjp, lambda rows: torch.stack([vjp(r) for r in rows]), size)
    return op, torch.randn(size, generator=torch.Generator().manual_seed(1))


def measure_gmres(table: Table, rounds: int, steps: int = 20) -> None:
    op, v = readme_nmf_operator()
    new, old = ih.linalg.GMRES(), StackedGMRES()
    g_new, _, _ = new.solve(op, v, steps, 1e-5)
    g_old, _, _ = old.solve(op, v, steps, 1e-5)
    diff = float((g_new - g_old).norm() / g_old.norm())
    times = medians(
        {
            "new": lambda: new.solve(op, v, steps, 1e-5),
            "old": lambda: old.solve(op, v, steps, 1e-5),
        },
        rounds,
        warmup=1,
    )
    table.add(
        "3. GMRES backward solve",
        f"README NMF d512 n4096 r64, {steps} VJPs",
        "previous GMRES (stacked basis, lstsq)",
        times["new"],
        times["old"],
        1.3,
        f"rel. diff of g {diff:.1e} (the previous solve's float32 lstsq rounding)",
    )
