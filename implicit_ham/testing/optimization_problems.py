"""The panels of small root and argmin problems ``check_root_solver`` / ``check_minimizer``
run on, and their independent references (plain loops, dense solves, ``torch.func``).

Root panel (``root_panel()``): ``g(z, *args) = 0``.

* ``cube_f64``: ``g = z^3 - a`` elementwise, z (3, 4); the root is ``a^(1/3)``.
* ``coupled_f64``: ``g = z A^T + 0.1 z^3 + mean_batch(z) - x`` (samples coupled), x and A
  in args, z (3, 4).
* ``tuple_f64``: a tuple state (u (3, 2), w (3, 2, 2)) with ``g_u = 2u + 0.1 tanh(w1) - x``,
  ``g_w = 3w - tanh(u)`` broadcast; x in args, a scale s closed over.
* ``cube_f32``: ``cube_f64`` in float32 (no gradient reference; dtype and value checks).

Argmin panel (``argmin_panel()``), every loss a sum of squares ``½||r(z)||²`` so that the
least-squares solvers run on the same problems:

* ``ridge_f64``: ``r = [X w - y; sqrt(lam) w]``, w (1, 5), X (12, 5) scaled so that the
  Hessian's eigenvalues lie in about [1, 3] (the default ``GradientDescent`` converges);
  the closed form ``(X^T X + lam I)^{-1} X^T y``; lam and X in args.
* ``expfit_f64``: ``r = a exp(b t) - y``, p = (a, b) (1, 2); y in args.
* ``ridge_f32``: ``ridge_f64`` in float32.

The loss of every problem is linear in the solution, ``<weights, z>``, so the reference
gradient is ``-(d g / d θ)^T (dg/dz)^{-T} weights`` (g = grad_z loss for an argmin), computed
with a dense ``torch.linalg.solve`` on ``torch.func.jacrev`` Jacobians at the reference root.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from implicit_ham.testing.problems import Structured, as_tuple


@dataclass(frozen=True)
class OptProblem:
    """A root problem (``fn`` = g) or a least-squares argmin problem (``fn`` = r).

    Attributes:
        name: e.g. "cube_f64". fn: g or r, ``fn(z, *args)``. z0: the initial state.
        args: the inputs (leaf tensors requiring grad). weights: the linear loss, per tensor.
        exact: whether gradient references apply (float64). reference: the solution, computed
        independently (a closed form or a plain loop).
    """

    name: str
    fn: Callable[..., Any]
    z0: Structured
    args: tuple[Tensor, ...]
    weights: tuple[Tensor, ...]
    exact: bool
    reference: Callable[[], tuple[Tensor, ...]]

    def loss(self, value: Structured) -> Tensor:
        """``sum_i <weights_i, value_i>``."""
        return sum((w * t).sum() for w, t in zip(self.weights, as_tuple(value), strict=True))  # type: ignore[return-value]

    def restore(self, z: tuple[Tensor, ...]) -> Structured:
        """The problem's own structure from a tuple."""
        return z if isinstance(self.z0, tuple) else z[0]

    def objective(self, z: Structured, *args: Tensor) -> Tensor:
        """``½||r(z)||²`` (argmin problems)."""
        r = self.fn(z, *args)
        return 0.5 * (r * r).sum()


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _leaf(t: Tensor) -> Tensor:
    return t.detach().requires_grad_()


def root_panel() -> list[OptProblem]:
    """Fresh root problems (see the module docstring)."""
    return [
        _cube("cube_f64", torch.float64),
        _coupled(),
        _tuple_root(),
        _cube("cube_f32", torch.float32),
    ]


def argmin_panel() -> list[OptProblem]:
    """Fresh argmin problems (see the module docstring)."""
    return [_ridge("ridge_f64", torch.float64), _expfit(), _ridge("ridge_f32", torch.float32)]


def _cube(name: str, dtype: torch.dtype) -> OptProblem:
    a = _leaf((0.5 + 3 * torch.rand(3, 4, generator=_gen(20), dtype=torch.float64)).to(dtype))
    weights = (torch.randn(3, 4, generator=_gen(21), dtype=torch.float64).to(dtype),)

    def g(z: Tensor, a: Tensor) -> Tensor:
        return z**3 - a

    return OptProblem(
        name,
        g,
        torch.ones(3, 4, dtype=dtype),
        (a,),
        weights,
        dtype == torch.float64,
        lambda: (a.detach() ** (1 / 3),),
    )


def _coupled() -> OptProblem:
    gen, dt = _gen(22), torch.float64
    A = _leaf(2 * torch.eye(4, dtype=dt) + 0.3 * torch.randn(4, 4, generator=gen, dtype=dt))
    x = _leaf(torch.randn(3, 4, generator=gen, dtype=dt))
    weights = (torch.randn(3, 4, generator=gen, dtype=dt),)

    def g(z: Tensor, x: Tensor, A: Tensor) -> Tensor:
        return z @ A.T + 0.1 * z**3 + z.mean(0, keepdim=True) - x

    z0 = torch.zeros(3, 4, dtype=dt)
    problem = OptProblem("coupled_f64", g, z0, (x, A), weights, True, lambda: ())
    return _with_reference(problem, lambda: plain_newton(problem))


def _tuple_root() -> OptProblem:
    gen, dt = _gen(23), torch.float64
    x = _leaf(torch.randn(3, 2, generator=gen, dtype=dt))
    scale = _leaf(torch.tensor(0.1, dtype=dt))
    weights = (
        torch.randn(3, 2, generator=gen, dtype=dt),
        torch.randn(3, 2, 2, generator=gen, dtype=dt),
    )

    def g(z: tuple[Tensor, Tensor], x: Tensor) -> tuple[Tensor, Tensor]:
        u, w = z
        return 2 * u + scale * torch.tanh(w[:, 0]) - x, 3 * w - torch.tanh(u)[:, None, :]

    z0 = (torch.zeros(3, 2, dtype=dt), torch.zeros(3, 2, 2, dtype=dt))
    problem = OptProblem("tuple_f64", g, z0, (x,), weights, True, lambda: ())
    return _with_reference(problem, lambda: plain_newton(problem))


def _ridge(name: str, dtype: torch.dtype) -> OptProblem:
    gen = _gen(24)
    X = _leaf((torch.randn(12, 5, generator=gen, dtype=torch.float64) / 12**0.5).to(dtype))
    y = torch.randn(12, generator=gen, dtype=torch.float64).to(dtype)
    lam = _leaf(torch.tensor(0.8, dtype=dtype))
    weights = (torch.randn(1, 5, generator=gen, dtype=torch.float64).to(dtype),)

    def r(w: Tensor, lam: Tensor, X: Tensor) -> Tensor:
        return torch.cat([X @ w[0] - y, lam.sqrt() * w[0]])

    def closed_form() -> tuple[Tensor, ...]:
        gram = X.detach().T @ X.detach() + lam.detach() * torch.eye(5, dtype=dtype)
        return (torch.linalg.solve(gram, X.detach().T @ y)[None],)

    return OptProblem(
        name,
        r,
        torch.zeros(1, 5, dtype=dtype),
        (lam, X),
        weights,
        dtype == torch.float64,
        closed_form,
    )


def _expfit() -> OptProblem:
    gen, dt = _gen(25), torch.float64
    t = torch.linspace(0, 2, 20, dtype=dt)
    y = _leaf(2.0 * torch.exp(-1.5 * t) + 0.05 * torch.randn(20, generator=gen, dtype=dt))
    weights = (torch.randn(1, 2, generator=gen, dtype=dt),)

    def r(p: Tensor, y: Tensor) -> Tensor:
        return p[:, :1] * torch.exp(p[:, 1:] * t) - y

    z0 = torch.tensor([[1.0, 0.0]], dtype=dt)
    problem = OptProblem("expfit_f64", r, z0, (y,), weights, True, lambda: ())
    near = torch.tensor([[2.0, -1.5]], dtype=dt)  # Newton's basin: the generating parameters
    return _with_reference(
        problem, lambda: plain_newton(problem, gradient_of_objective=True, start=near)
    )


def _with_reference(problem: OptProblem, reference: Callable[[], tuple[Tensor, ...]]) -> OptProblem:
    return OptProblem(
        problem.name,
        problem.fn,
        problem.z0,
        problem.args,
        problem.weights,
        problem.exact,
        reference,
    )


def condition_map(problem: OptProblem, gradient_of_objective: bool) -> Callable[..., Tensor]:
    """The flat optimality map: ``g`` itself, or ``grad_z ½||r||²`` for an argmin problem."""
    like = as_tuple(problem.z0)

    def split(flat: Tensor) -> Structured:
        parts = torch.split(flat, [t.numel() for t in like])
        return problem.restore(tuple(p.reshape(t.shape) for p, t in zip(parts, like, strict=True)))

    def flat_g(flat: Tensor, *args: Tensor) -> Tensor:
        if gradient_of_objective:
            return torch.func.grad(lambda y: problem.objective(split(y), *args))(flat)
        return torch.cat([t.reshape(-1) for t in as_tuple(problem.fn(split(flat), *args))])

    return flat_g


def plain_newton(
    problem: OptProblem,
    gradient_of_objective: bool = False,
    steps: int = 40,
    start: Tensor | None = None,
) -> tuple[Tensor, ...]:
    """The solution by a plain dense Newton loop (jacrev + torch.linalg.solve) from ``start``
    (default z0), no library solver involved."""
    flat_g = condition_map(problem, gradient_of_objective)
    args = tuple(a.detach() for a in problem.args)
    first = as_tuple(problem.z0) if start is None else (start,)
    z = torch.cat([t.reshape(-1) for t in first])
    with torch.no_grad():
        for _ in range(steps):
            jac = torch.func.jacrev(flat_g)(z, *args)
            z = z - torch.linalg.solve(jac, flat_g(z, *args))
    return _split_like(z, as_tuple(problem.z0))


def ift_gradient(
    problem: OptProblem, z_star: tuple[Tensor, ...], gradient_of_objective: bool
) -> tuple[Tensor, ...]:
    """``-(d g/d args)^T (dg/dz)^{-T} weights`` at z*, densely (g = the optimality map)."""
    flat_g = condition_map(problem, gradient_of_objective)
    z = torch.cat([t.detach().reshape(-1) for t in z_star])
    args = tuple(a.detach() for a in problem.args)
    jac = torch.func.jacrev(flat_g)(z, *args)
    v = torch.cat([w.reshape(-1) for w in problem.weights])
    u = torch.linalg.solve(jac.T, v)
    leaves = tuple(a.clone().requires_grad_() for a in args)
    grads = torch.autograd.grad(-(flat_g(z, *leaves) * u).sum(), leaves, allow_unused=True)
    return tuple(torch.zeros_like(a) if g is None else g for g, a in zip(grads, args, strict=True))


def _split_like(flat: Tensor, like: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
    parts = torch.split(flat, [t.numel() for t in like])
    return tuple(p.reshape(t.shape) for p, t in zip(parts, like, strict=True))
