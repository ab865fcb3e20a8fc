"""The at-fixed-point gradient under torch.func transforms (grad, vjp, jacrev, jacfwd, vmap).

Under a transform the mode cannot replay an autograd graph of f in its backward pass, so the
gradient is attached differently: with z* detached and ``δ = f(z*, θ) - sg(f(z*, θ))`` (zero
in value, f's derivatives in θ at fixed z*), the output is ``z* + S(δ)``, where ``S`` is an
``autograd.Function`` that is the identity on δ's value (so the value is exactly z*) and maps
derivatives through the linear solve: reverse mode (``backward``) ``v -> (I - J^T)^{-1} v``,
forward mode (``jvp``) ``t -> (I - J)^{-1} t``, with ``J^T x`` and ``J x`` as ``torch.func``
VJPs / JVPs of f at z*. For a root of g the systems are ``(dg/dz)^T`` and ``dg/dz`` and the
result is negated. Neumann's series runs the same way on either operator. ``generate_vmap_rule``
vmaps ``S`` itself (jacrev and jacfwd vmap the backward / forward pass).

What is checked and what is not:

* Under ``vmap`` (including the one inside jacrev / jacfwd) values cannot steer Python code:
  the fixed-point check and the solve's convergence and finiteness checks are skipped, and a
  linear solver that stops on a tolerance (GMRES, CG, fixed_point, Anderson, Broyden) is
  refused; ``Dense`` (an exact solve, no iteration) and ``Neumann`` (a fixed number of terms)
  run. Under ``grad`` / ``vjp`` alone every check runs as in eager mode.
* A second derivative by nested transforms (``jacrev(grad(...))``, ``hessian``) is refused
  (``SecondOrderError``): z* is detached here. Use ``torch.autograd`` with ``create_graph=True``.
* ``torch.compile`` traces the same construction (without the jvp, which it does not trace) for
  a solve without value-dependent control flow (dense, Neumann) unless ``on_divergence`` is
  "fallback": zero graph breaks with ``fixed_point_tol=None``; with a tolerance, the fixed-point
  check runs eagerly in the forward pass (a graph break) and warns or raises as in eager mode.
  The compiled backward pass skips the solve's host checks (finiteness, condition number), as
  every compiled graph does.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch.func import jvp, vjp, vmap

from implicit_ham._core.errors import SecondOrderError
from implicit_ham._core.precision import working_dtype
from implicit_ham._core.state import BoundStep, State, StateSpec, per_sample_norm
from implicit_ham._core.stats import BackwardStats
from implicit_ham._core.transforms import active_transforms, host_checks, under_vmap
from implicit_ham.adjoints.second_order import BackwardSolve
from implicit_ham.linalg.operator import AdjointOperator

DIFFERENTIATING = ("Grad", "Jvp")


@dataclass
class TransformedSolve:
    """What ``S`` needs: the map at the detached solution and the mode's solve.

    Attributes:
        bound: f (or g for a root) with its inputs. z_star: the detached solution.
        spec: the state's structure. backward_solve: the mode's solve of ``A^T g = v``.
        go_on: applies the fixed-point check to the worst residual (False: fall back to g = v).
        root: whether ``bound`` is a root's g.
        vmappable: whether ``backward_solve`` runs under vmap (no value-dependent control
            flow). adjoint: the mode's name. log: each solve's ``BackwardStats``.
        checks_point: whether the mode checks the fixed point (``fixed_point_tol`` given).
        residual: (B,) forward residual per sample (set when the gradient is attached).
    """

    bound: BoundStep
    z_star: State
    spec: StateSpec
    backward_solve: BackwardSolve
    go_on: Callable[[float], bool]
    root: bool
    vmappable: bool
    adjoint: str
    log: list[BackwardStats]
    checks_point: bool = True
    residual: Tensor | None = None

    def solve(self, vectors: tuple[Tensor | None, ...], transpose: bool) -> State:
        """The derivative through z*: ``(A^T)^{-1}`` (transpose) or ``A^{-1}`` applied to the
        incoming gradient / tangent, negated for a root."""
        if under_vmap() and not self.vmappable:
            raise NotImplementedError(
                f"{self.adjoint} under torch.func.vmap (also inside jacrev / jacfwd): its "
                "linear solver stops on a tolerance, which a batched value cannot decide. Use "
                "Implicit(linear_solver='dense') or Neumann there, or torch.func.grad / vjp / "
                "torch.autograd."
            )
        v = self.spec.flatten(self.spec.zeros_like_missing(vectors, self.z_star))
        v = v.reshape(-1).to(working_dtype(self.spec.dtype))
        op = self._operator(v.numel(), transpose)
        residual = self.residual
        worst = 0.0
        if host_checks() and residual is not None and residual.numel():
            worst = float(residual.max())
        if self.go_on(worst):
            with torch.no_grad():  # first order only (nested differentiation is refused)
                g, stats = self.backward_solve(op, v)
        else:
            g = v.clone()
            stats = BackwardStats(self.adjoint, "none", 0, math.nan, math.nan, None, fallback=True)
        if host_checks():
            self.log.append(stats)
        if self.root:
            g = -g
        return self.spec.unflatten(g.reshape(self.spec.batch, -1).to(self.spec.dtype))

    def _operator(self, size: int, transpose: bool) -> AdjointOperator:
        spec = self.spec

        def call(*z: Tensor) -> State:
            return self.bound(z)

        if transpose:
            pull = vjp(call, *self.z_star)[1]

            def product(x: Tensor) -> Tensor:
                out = pull(spec.unflatten(x.to(spec.dtype)))
                return spec.flatten(out).reshape(-1).to(x.dtype)
        else:

            def product(x: Tensor) -> Tensor:
                out = jvp(call, self.z_star, spec.unflatten(x.to(spec.dtype)))[1]
                return spec.flatten(out).reshape(-1).to(x.dtype)

        rows = vmap(product)
        if not self.root:
            return AdjointOperator(product, rows, size, batch=spec.batch)
        label = "(dg/dz)^T" if transpose else "dg/dz"
        return AdjointOperator(
            lambda x: x - product(x), lambda r: r - rows(r), size, product, rows, label,
            spec.batch,
        )


class _SolveReverse(torch.autograd.Function):
    """``S`` without forward mode, for ``torch.compile`` (which does not trace a custom jvp)."""

    @staticmethod
    def forward(solve: TransformedSolve, *delta: Tensor) -> tuple[Tensor, ...]:
        return tuple(d.clone() for d in delta)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        ctx.solve = inputs[0]

    @staticmethod
    def backward(ctx: Any, *grads: Tensor | None) -> tuple[Tensor | None, ...]:
        return (None, *ctx.solve.solve(grads, transpose=True))


class _Solve(_SolveReverse):
    """``S``: the identity on δ (zero) in value; the linear solve on its derivatives (reverse
    mode, forward mode and a generated vmap rule)."""

    generate_vmap_rule = True

    @staticmethod
    def jvp(ctx: Any, *tangents: Tensor | None) -> tuple[Tensor, ...]:
        return ctx.solve.solve(tangents[1:], transpose=False)


def attach_under_transforms(solve: TransformedSolve) -> State:
    """z* (same values) carrying the mode's derivative in every torch.func transform.

    Raises:
        SecondOrderError: under nested differentiating transforms (a second derivative).
    """
    levels = [name for name in active_transforms() if name in DIFFERENTIATING]
    if len(levels) > 1:
        nested = " > ".join(active_transforms())
        raise SecondOrderError(
            f"{solve.adjoint} under nested torch.func transforms ({nested}) "
            "asks for a second derivative, which this mode does not give under torch.func (z* is "
            "held fixed there). Use torch.autograd.grad(..., create_graph=True) twice instead."
        )
    with torch.enable_grad():
        out = solve.bound(solve.z_star)
        delta = tuple(t - t.detach() for t in out)
        function = _SolveReverse if torch.compiler.is_compiling() else _Solve
        moved = function.apply(solve, *delta)
    with torch.no_grad():
        values = tuple(t.detach() for t in out)
        if solve.root:
            solve.residual = per_sample_norm(values)
        else:
            steps = tuple(a - b for a, b in zip(values, solve.z_star, strict=True))
            change = per_sample_norm(steps)
            solve.residual = change / (per_sample_norm(values) + torch.finfo(change.dtype).tiny)
    if torch.compiler.is_compiling() and solve.checks_point:
        # imported here, under torch.compile only: the decorator imports torch._dynamo
        from implicit_ham.adjoints.compiled_check import check_outside_the_graph

        check_outside_the_graph(solve, solve.residual)
    return tuple(z + m for z, m in zip(solve.z_star, moved, strict=True))
