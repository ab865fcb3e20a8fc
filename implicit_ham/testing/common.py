"""Checks shared by the solver and backward-mode kits: run a mode on a panel problem, then the
generic contract (same value, dtype / device / shape, no dead inputs, clear errors)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from implicit_ham._core.errors import NonFiniteError
from implicit_ham.adjoints.modes import Adjoint
from implicit_ham.problems.fixed_point import fixed_point
from implicit_ham.solvers.base import FixedPointSolver
from implicit_ham.testing.problems import Problem, as_tuple
from implicit_ham.testing.references import (
    Gradient,
    directional_errors,
    input_gradient,
    random_directions,
)
from implicit_ham.testing.report import NotApplicableError, require, require_close

SECOND_ORDER_RTOL = 1e-5
TWICE = ("differentiate twice", "create_graph", "double backward", "second derivative")


@dataclass(frozen=True)
class Run:
    """One solve of a problem under one backward mode, and its input gradient."""

    mode: str
    value: tuple[Tensor, ...]
    gradient: Gradient


def solve_and_differentiate(problem: Problem, solver: FixedPointSolver, adjoint: Adjoint) -> Run:
    """``fixed_point`` on the problem, then d loss / d inputs (zeros for unused inputs)."""
    sol = fixed_point(problem.f, problem.z0, *problem.args, solver=solver, adjoint=adjoint)
    return Run(adjoint.name, as_tuple(sol.value), input_gradient(problem, sol.value))


def solve_or_skip(problem: Problem, solver: FixedPointSolver, adjoint: Adjoint) -> Run:
    """As ``solve_and_differentiate``; a ValueError (a solver refusing a mode, as torchdeq's
    solvers refuse Unroll) skips the calling check."""
    try:
        return solve_and_differentiate(problem, solver, adjoint)
    except ValueError as err:
        raise NotApplicableError(f"{solver.name} refuses {adjoint.name}: {err}") from err


def values_equal(reference: Run, other: Run) -> dict[str, float]:
    """Require bitwise equal values (``torch.equal`` per state tensor); a failure gives the
    difference in eps of the dtype."""
    diff = max(
        float((a - b).detach().abs().max()) if a.numel() else 0.0
        for a, b in zip(reference.value, other.value, strict=True)
    )
    dtype = reference.value[0].dtype
    in_eps = diff / torch.finfo(dtype).eps
    same = all(torch.equal(a, b) for a, b in zip(reference.value, other.value, strict=True))
    require(
        same,
        f"the value under {other.mode} differs from the value under {reference.mode} by "
        f"{diff:.3e} = {in_eps:.1f} x eps({dtype}) (the backward mode must never change the "
        "forward value)",
        max_abs_diff=diff,
        diff_in_eps=in_eps,
    )
    return {"max_abs_diff": diff, "diff_in_eps": in_eps}


def dtype_device_shape(problem: Problem, run: Run) -> dict[str, float]:
    """Require the value shaped, typed and placed like z0, the gradients like the inputs."""
    for i, (v, z) in enumerate(zip(run.value, as_tuple(problem.z0), strict=True)):
        require(
            v.shape == z.shape,
            f"{run.mode}: value[{i}] has shape {tuple(v.shape)}, z0 has {tuple(z.shape)}",
        )
        require(v.dtype == z.dtype, f"{run.mode}: value[{i}] has dtype {v.dtype}, z0 has {z.dtype}")
        require(v.device == z.device, f"{run.mode}: value[{i}] is on {v.device}, z0 on {z.device}")
    for name, g, t in zip(problem.input_names, run.gradient, problem.inputs, strict=True):
        require(
            g.dtype == t.dtype and g.shape == t.shape and g.device == t.device,
            f"{run.mode}: the gradient of {name} is {g.dtype} {tuple(g.shape)} on "
            f"{g.device}, the input is {t.dtype} {tuple(t.shape)} on {t.device}",
        )
    return {}


def no_dead_inputs(problem: Problem, run: Run) -> dict[str, float]:
    """Require every input's gradient finite and non-zero (each one influences the value)."""
    if problem.batch == 0:
        raise NotApplicableError("an empty batch gives zero gradients")
    smallest = math.inf
    for name, g in zip(problem.input_names, run.gradient, strict=True):
        norm = float(g.norm())
        require(
            math.isfinite(norm),
            f"{run.mode}: the gradient of {name} is not finite",
            grad_norm=norm,
        )
        require(
            norm > 0,
            f"{run.mode}: {name} {tuple(g.shape)} gets a zero gradient though "
            "it influences the value (a dead input or parameter)",
            grad_norm=norm,
        )
        smallest = min(smallest, norm)
    return {"min_grad_norm": smallest}


def expect_error(what: str, call: Callable[[], object], expected: type[Exception]) -> None:
    """Require ``call()`` to raise ``expected`` (exactly that family, with a message)."""
    try:
        call()
    except expected as err:
        require(bool(str(err)), f"{what}: {expected.__name__} without a message")
        return
    except Exception as err:  # any other error breaks the contract
        require(False, f"{what}: expected {expected.__name__}, got {type(err).__name__}: {err}")
    require(False, f"{what}: no error raised (expected {expected.__name__})")


def matches_fd(
    inputs: tuple[Tensor, ...],
    gradient: Gradient,
    loss: Callable[[], Tensor],
    tol: float,
    what: str,
) -> dict[str, float]:
    """Require ``gradient`` of ``loss`` w.r.t. ``inputs`` to match central differences
    (directional, relative error ``<= tol``); ``what`` names the disagreement."""
    err, norm = directional_errors(inputs, gradient, loss)
    return require_close(err, tol, what, fd_norm=norm)


def clear_errors(problem: Problem, solver: FixedPointSolver, adjoint: Adjoint) -> dict[str, float]:
    """Require the documented errors, with a message, for a wrong-shaped return of f
    (ValueError), a dtype change (TypeError) and NaN in z0 (NonFiniteError)."""
    z0 = as_tuple(problem.z0)[0]
    cases = [
        ("f returns a wrong shape", lambda z, *a: problem.f(z, *a)[:, :-1], z0, ValueError),
        ("f changes the dtype", lambda z, *a: problem.f(z, *a).float(), z0, TypeError),
        ("z0 holds NaN", problem.f, torch.full_like(z0, math.nan), NonFiniteError),
    ]
    for what, f, start, expected in cases:

        def run(f: Callable[..., Tensor] = f, start: Tensor = start) -> None:
            sol = fixed_point(f, start, *problem.args, solver=solver, adjoint=adjoint)
            input_gradient(problem, sol.value)

        expect_error(what, run, expected)
    return {}


def second_derivative(
    problem: Problem, solver: FixedPointSolver, adjoint: Adjoint, rtol: float = SECOND_ORDER_RTOL
) -> dict[str, float]:
    """A mode that gives a second derivative gives the derivative of its own gradient: with
    h(θ) = <grad_θ loss, u> (u a fixed random direction), ``create_graph=True`` and a second
    ``autograd.grad`` must match central differences of h (relative error ``<= rtol``; a mode
    that solves a linear system to a tolerance gets a looser one). Refusing (an error that says
    the mode cannot be differentiated twice) passes; a crash or a wrong value fails."""
    (u,) = random_directions(problem.inputs, 1, seed=7)

    def h(create_graph: bool) -> Tensor:
        sol = fixed_point(problem.f, problem.z0, *problem.args, solver=solver, adjoint=adjoint)
        loss = problem.loss(sol.value)
        grads = torch.autograd.grad(
            loss, problem.inputs, create_graph=create_graph, allow_unused=True
        )
        terms = [(g * d).sum() for g, d in zip(grads, u, strict=True) if g is not None]
        return torch.stack(terms).sum() if terms else torch.zeros(())

    try:
        first = h(create_graph=True)  # a mode may refuse here (in its backward) or below
        if not first.requires_grad:
            raise RuntimeError("the gradient has no graph under create_graph=True")
        hessian_u = torch.autograd.grad(first, problem.inputs, allow_unused=True)
    except RuntimeError as refusal:
        refused = any(word in str(refusal) for word in TWICE)
        require(refused, f"the second derivative neither works nor is refused clearly: {refusal}")
        raise NotApplicableError(f"refuses a second derivative: {refusal}") from refusal
    hessian_u = tuple(
        torch.zeros_like(t) if g is None else g
        for g, t in zip(hessian_u, problem.inputs, strict=True)
    )
    err, norm = directional_errors(
        problem.inputs, hessian_u, lambda: h(create_graph=False), with_grad=True
    )
    return require_close(
        err,
        rtol,
        "the second derivative (create_graph=True) is not the derivative of the gradient",
        fd_norm=norm,
    )
