"""Convergence diagnostics: residual / objective traces of any solver on any problem, steps to a
tolerance, and the gradient as a function of the number of iterations K per backward mode
(BPTT's vanishing / exploding gradient, and how fast each mode approaches the implicit one).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from implicit_ham._core.state import StateSpec, per_sample_norm
from implicit_ham.adjoints.modes import Adjoint, Implicit, Unroll
from implicit_ham.diagnostics.conditioning import contraction_rate
from implicit_ham.diagnostics.fidelity import describe_adjoint
from implicit_ham.diagnostics.table import Rows
from implicit_ham.linalg.dense import Dense
from implicit_ham.problems.fixed_point import FixedPointProblem
from implicit_ham.solvers.base import SOLVERS, FixedPointSolver
from implicit_ham.solvers.iteration import FixedPointIteration

Objective = Callable[[Any], Tensor | float]


@dataclass
class ConvergenceTrace:
    """Per-evaluation traces of one forward solve.

    Attributes:
        solver: the solver's name.
        residuals: (steps, B) absolute residuals ``||f(z_k) - z_k||`` (the solver's own trace).
        rel_residuals: (steps, B) the same divided by ``||f(z_k)||``.
        objective: (steps, B) ``objective(z_k)`` at every evaluated iterate, or None.
        seconds: wall time of the solve (including the objective evaluations).
    """

    solver: str
    residuals: Tensor
    rel_residuals: Tensor
    objective: Tensor | None
    seconds: float


def convergence_trace(
    problem: FixedPointProblem, solver: FixedPointSolver | str, objective: Objective | None = None
) -> ConvergenceTrace:
    """Solve ``problem`` with ``solver`` (no gradient) and record its traces.

    Args:
        problem: the fixed-point problem.
        solver: any forward solver (or its registry name).
        objective: optional ``objective(z) -> (B,) tensor or scalar``, evaluated on the state at
            every evaluation of ``f`` (so it lines up with the residual trace row by row).
    """
    values: list[Tensor] = []
    scales: list[Tensor] = []
    changes: list[Tensor] = []  # per call: ||f(z) - z|| (to find the solver's rows among them)

    def traced(z: Any, *args: Any) -> Any:
        out = problem.f(z, *args)
        spec = StateSpec.of(out)
        pairs = zip(spec.as_tuple(out), StateSpec.of(z).as_tuple(z), strict=True)
        scales.append(per_sample_norm(spec.as_tuple(out)))
        changes.append(per_sample_norm(tuple(a - b for a, b in pairs)))
        if objective is not None:
            value = torch.as_tensor(objective(z), dtype=scales[-1].dtype)
            values.append(value.to(scales[-1].device).expand_as(scales[-1]))
        return out

    solver = SOLVERS.resolve(solver, FixedPointSolver)
    if isinstance(solver, FixedPointIteration):
        solver = dataclasses.replace(solver, trace=True)  # the per-step trace is opt-in
    start = time.perf_counter()
    with torch.no_grad():
        sol = FixedPointProblem(traced, problem.z0, problem.args).solve(solver, Implicit())
    seconds = time.perf_counter() - start
    residuals = sol.stats.residuals
    steps = residuals.shape[0]
    first = _rows_start(residuals, changes)
    norms = torch.stack(scales[first : first + steps]) if steps else residuals
    rel = residuals / norms.clamp_min(torch.finfo(residuals.dtype).tiny)
    trace = torch.stack(values[first : first + steps]) if objective is not None and steps else None
    return ConvergenceTrace(sol.stats.solver, residuals, rel, trace, seconds)


def _rows_start(residuals: Tensor, changes: list[Tensor]) -> int:
    """The call at which the solver's residual rows (steps, B) begin among the calls of ``f``
    (each call's ``||f(z) - z||`` in ``changes``): the window that matches them best. A solve
    may call ``f`` besides its rows: a retry before them (Anderson's stronger
    regularisation, a whole-batch re-solve), a measurement at the returned point after them."""
    steps = residuals.shape[0]
    if steps == 0 or len(changes) <= steps:
        return max(len(changes) - steps, 0)
    calls = torch.stack(changes).to(residuals.dtype)
    scale = residuals.abs().amax().clamp_min(torch.finfo(residuals.dtype).tiny)
    misfit = [
        float((calls[start : start + steps] - residuals).abs().amax() / scale)
        for start in range(len(changes) - steps + 1)
    ]
    return min(range(len(misfit)), key=lambda start: (misfit[start], -start))


def steps_to_tolerance(residuals: Tensor, tol: float) -> Tensor:
    """(B,) int64: the number of steps after which each sample's residual is first ``<= tol``
    (1-based: ``residuals[k]`` belongs to step k + 1); -1 where it never gets there."""
    hit = residuals <= tol
    first = hit.to(torch.int64).argmax(dim=0) + 1
    return torch.where(hit.any(dim=0), first, torch.full_like(first, -1))


def convergence_rows(
    problem: FixedPointProblem,
    solvers: Mapping[str, FixedPointSolver | str],
    tol: float = 1e-6,
    objective: Objective | None = None,
) -> tuple[Rows, dict[str, ConvergenceTrace]]:
    """One row per solver: steps, final relative residual (worst sample), steps to ``tol`` on
    the relative residual (worst sample, -1 if never), empirical contraction rate (median over
    samples), final objective (mean; only with ``objective``), and wall time. Also returns the
    traces (for plots)."""
    rows, traces = Rows(), {}
    for label, solver in solvers.items():
        tr = convergence_trace(problem, solver, objective)
        traces[label] = tr
        reach = steps_to_tolerance(tr.rel_residuals, tol)
        row = {
            "solver": label,
            "steps": tr.residuals.shape[0],
            "final_rel_residual": float(tr.rel_residuals[-1].max()),
            f"steps_to_{tol:g}": -1 if bool((reach < 0).any()) else int(reach.max()),
            "contraction": float(contraction_rate(tr.residuals, tail=5).median()),
        }
        if tr.objective is not None:
            row["objective"] = float(tr.objective[-1].mean())
        rows.append(row | {"seconds": tr.seconds})
    return rows, traces


def _gradient(
    problem: FixedPointProblem,
    solver: FixedPointSolver,
    adjoint: Adjoint,
    loss_fn: Callable[[Any], Tensor],
    wrt: Sequence[Tensor],
) -> Tensor:
    loss = loss_fn(problem.solve(solver, adjoint).value)
    grads = torch.autograd.grad(loss, list(wrt), allow_unused=True)
    return torch.cat(
        [
            (torch.zeros_like(w) if g is None else g).reshape(-1)
            for g, w in zip(grads, wrt, strict=True)
        ]
    )


def grad_vs_k(
    problem: FixedPointProblem,
    loss_fn: Callable[[Any], Tensor],
    ks: Sequence[int],
    adjoints: Mapping[str, Adjoint] | None = None,
    *,
    wrt: Sequence[Tensor] | None = None,
    solver_for: Callable[[int], FixedPointSolver] | None = None,
    reference: Adjoint | None = None,
    reference_solver: FixedPointSolver | None = None,
    same_k: Adjoint | None = None,
) -> Rows:
    """Gradient norm and agreement with the fixed-point gradient as a function of K.

    Args:
        problem: the problem; its floating ``args`` requiring grad are differentiated by default.
        loss_fn: solution -> scalar loss.
        ks: iteration counts K.
        adjoints: label -> backward mode; default ``{"unroll": Unroll()}`` (BPTT).
        wrt: tensors to differentiate (default: tensors in ``problem.args`` requiring grad).
        solver_for: K -> forward solver; default ``FixedPointIteration(max_steps=K)``.
        reference: mode of the reference gradient; default ``Implicit`` with the dense solver.
        reference_solver: solver of the reference solve; default
            ``FixedPointIteration(max_steps=1000, tol=1e-10)``.
        same_k: optionally a second reference taken at each K with ``solver_for(K)``, e.g.
            ``Unroll()``: the exact gradient of the K-step map; adds the column
            ``cosine_same_k``.

    Returns:
        ``Rows`` with adjoint, K, grad_norm, cosine and rel_error against the reference,
        ref_grad_norm, and cosine_same_k when ``same_k`` is given.
    """
    adjoints = {"unroll": Unroll()} if adjoints is None else adjoints
    solver_for = solver_for or (lambda k: FixedPointIteration(max_steps=k))
    wrt = (
        list(wrt)
        if wrt is not None
        else [a for a in problem.args if isinstance(a, Tensor) and a.requires_grad]
    )
    if not wrt:
        raise ValueError(
            "grad_vs_k: nothing to differentiate; give problem args that require grad or wrt="
        )
    ref_solver = reference_solver or FixedPointIteration(max_steps=1000, tol=1e-10)
    ref_mode = reference or Implicit(linear_solver=Dense(), tol=1e-8)
    ref = _gradient(problem, ref_solver, ref_mode, loss_fn, wrt)
    ref_norm = float(torch.linalg.vector_norm(ref))
    per_k = {k: _gradient(problem, solver_for(k), same_k, loss_fn, wrt) for k in ks if same_k}
    rows = Rows()
    for label, adjoint in adjoints.items():
        for k in ks:
            g = _gradient(problem, solver_for(k), adjoint, loss_fn, wrt)
            norm = float(torch.linalg.vector_norm(g))
            row = {
                "adjoint": label or describe_adjoint(adjoint),
                "K": k,
                "grad_norm": norm,
                "cosine": _cosine(g, ref),
                "rel_error": float(torch.linalg.vector_norm(g - ref)) / ref_norm
                if ref_norm > 0
                else math.nan,
                "ref_grad_norm": ref_norm,
            }
            if same_k is not None:
                row["cosine_same_k"] = _cosine(g, per_k[k])
            rows.append(row)
    return rows


def _cosine(a: Tensor, b: Tensor) -> float:
    """Cosine of two flat vectors; NaN when either is zero."""
    denom = float(torch.linalg.vector_norm(a) * torch.linalg.vector_norm(b))
    return float(a @ b) / denom if denom > 0 else math.nan


def bptt_grad_norms(
    problem: FixedPointProblem,
    loss_fn: Callable[[Any], Tensor],
    ks: Sequence[int],
    **kwargs: Any,
) -> Rows:
    """Rows of (K, grad_norm, ...) under ``Unroll`` (BPTT): ``grad_vs_k`` with one mode."""
    return grad_vs_k(problem, loss_fn, ks, {"unroll": Unroll()}, **kwargs)
