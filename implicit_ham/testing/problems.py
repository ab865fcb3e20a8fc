"""The panel of small fixed-point problems every plug-in is run on.

Each ``Problem`` is ``z = f(z, *args)`` with tensors the gradient must reach: ``args`` (passed to
``fixed_point``) and ``params`` (tensors ``f`` closes over, as a module's parameters). Every map
is a contraction (Lipschitz constant <= 0.4 in z), so a plain loop converges to machine
precision in ~60 steps and the references can be computed independently of the library. The
loss is linear, ``sum_i <weights_i, z_i>``, so its gradient at the solution is ``weights``.

The panel (``panel()``):

* ``tanh_f64``: ``z' = tanh(z W^T + x U^T + b)``, z (3, 4), x (3, 3), W, U, b closed over.
* ``tuple_f64``: two coupled state tensors u (3, 3), w (3, 2, 2).
* ``batch_f64``: ``z' = tanh(z W^T + mean_batch(z) A^T + x)``; the samples are coupled.
* ``noncontig_f64``: ``tanh_f64`` with a transposed (non-contiguous) x and z0.
* ``tanh_f32``: ``tanh_f64`` in float32 (no gradient references; dtype and value checks).
* ``empty_f64``: ``tanh_f64`` with an empty batch (B = 0).

``spd_panel()``: gradient-descent maps ``z' = z - a grad psi(z)`` of a strongly convex psi, whose
``I - J = a Hessian`` is symmetric positive definite, for linear solvers that need such a
system (``LinearSolver.requires_spd``, e.g. CG): ``gradstep_f64`` and ``gradstep_f32``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

Structured = Tensor | tuple[Tensor, ...]
CONTRACTION = 0.4
PLAIN_LOOP_STEPS = 80


@dataclass(frozen=True)
class Problem:
    """A panel problem ``z = f(z, *args)``.

    Attributes:
        name: e.g. "tanh_f64".
        f: ``f(z, *args) -> z'``, same structure as z.
        z0: the initial state, (B, ...) or a tuple of (B, ...) tensors.
        args: inputs passed to ``fixed_point`` (leaf tensors requiring grad).
        params: tensors ``f`` closes over (leaf tensors requiring grad).
        weights: the loss weights, shaped like the state (as a tuple).
        exact: whether gradient references apply (float64, non-empty batch).
        input_names: a name per input (``args`` then ``params``), for messages.
    """

    name: str
    f: Callable[..., Any]
    z0: Structured
    args: tuple[Tensor, ...]
    params: tuple[Tensor, ...]
    weights: tuple[Tensor, ...]
    exact: bool
    input_names: tuple[str, ...]

    @property
    def inputs(self) -> tuple[Tensor, ...]:
        """Every tensor the gradient must reach: ``args`` then ``params``."""
        return self.args + self.params

    @property
    def dtype(self) -> torch.dtype:
        """The state's dtype."""
        return as_tuple(self.z0)[0].dtype

    @property
    def batch(self) -> int:
        """B."""
        return as_tuple(self.z0)[0].shape[0]

    def loss(self, value: Structured) -> Tensor:
        """``sum_i <weights_i, value_i>`` (a scalar)."""
        return sum((w * t).sum() for w, t in zip(self.weights, as_tuple(value), strict=True))  # type: ignore[return-value]

    def step(self, z: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
        """One application of ``f`` on the tuple form of the state."""
        return as_tuple(self.f(self.restore(z), *self.args))

    def restore(self, z: tuple[Tensor, ...]) -> Structured:
        """The problem's own structure (Tensor or tuple) from a tuple."""
        return z if isinstance(self.z0, tuple) else z[0]

    def iterate(self, steps: int) -> tuple[Tensor, ...]:
        """``steps`` plain applications of ``f`` from z0, without gradient."""
        z = as_tuple(self.z0)
        with torch.no_grad():
            for _ in range(steps):
                z = self.step(z)
        return z

    def plain_fixed_point(self) -> tuple[Tensor, ...]:
        """The fixed point by a plain loop of ``PLAIN_LOOP_STEPS`` steps, without gradient."""
        return self.iterate(PLAIN_LOOP_STEPS)


def as_tuple(z: Structured) -> tuple[Tensor, ...]:
    """A Tensor or tuple of Tensors as a tuple."""
    return tuple(z) if isinstance(z, (tuple, list)) else (z,)


def panel() -> list[Problem]:
    """Fresh problems (new leaf tensors, deterministic values), see the module docstring."""
    return [
        tanh_problem("tanh_f64", torch.float64, batch=3),
        tuple_problem("tuple_f64"),
        batch_coupled_problem("batch_f64"),
        tanh_problem("noncontig_f64", torch.float64, batch=3, transposed=True),
        tanh_problem("tanh_f32", torch.float32, batch=3),
        tanh_problem("empty_f64", torch.float64, batch=0),
    ]


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _leaf(t: Tensor) -> Tensor:
    return t.detach().requires_grad_()


def _contraction(n: int, gen: torch.Generator, dtype: torch.dtype, scale: float) -> Tensor:
    w = torch.randn(n, n, generator=gen, dtype=torch.float64)
    return (scale * w / torch.linalg.matrix_norm(w, ord=2)).to(dtype)


def _weights(shapes: list[tuple[int, ...]], gen: torch.Generator, dtype: torch.dtype):
    return tuple(torch.randn(s, generator=gen, dtype=torch.float64).to(dtype) for s in shapes)


def tanh_problem(
    name: str, dtype: torch.dtype, batch: int, transposed: bool = False, width: int = 4
) -> Problem:
    """``z' = tanh(z W^T + x U^T + b)``: z (B, 4), x (B, 3) in args; W (4, 4) with
    ``||W||_2 = CONTRACTION``, U (4, 3), b (4,) closed over. ``transposed``: x and z0 are
    transposes of (3, B) and (4, B) tensors (non-contiguous)."""
    gen = _generator(1)
    W = _leaf(_contraction(width, gen, dtype, CONTRACTION))
    U = _leaf(0.5 * torch.randn(width, 3, generator=gen, dtype=torch.float64).to(dtype))
    b = _leaf(0.3 * torch.randn(width, generator=gen, dtype=torch.float64).to(dtype))
    raw = torch.randn(3, max(batch, 1), generator=gen, dtype=torch.float64).to(dtype)[:, :batch]
    x = _leaf(raw.T if transposed else raw.T.contiguous())

    def f(z: Tensor, x: Tensor) -> Tensor:
        return torch.tanh(z @ W.T + x @ U.T + b)

    z0 = (
        torch.zeros(width, batch, dtype=dtype).T
        if transposed
        else torch.zeros(batch, width, dtype=dtype)
    )
    weights = _weights([(batch, width)], gen, dtype)
    exact = dtype == torch.float64 and batch > 0
    names = ("args[0] (x)", "W (closed over)", "U (closed over)", "b (closed over)")
    return Problem(name, f, z0, (x,), (W, U, b), weights, exact, names)


def tuple_problem(name: str, batch: int = 3) -> Problem:
    """Two coupled state tensors: ``u' = tanh(u P + vec(w) Q + x)`` (B, 3),
    ``w' = tanh(u R + vec(w) S) / 2`` reshaped to (B, 2, 2); x in args, P, Q, R, S closed
    over, scaled so the joint map is a contraction."""
    gen, dt = _generator(2), torch.float64

    def mat(rows: int, cols: int) -> Tensor:
        m = torch.randn(rows, cols, generator=gen, dtype=dt)
        return _leaf(0.2 * m / torch.linalg.matrix_norm(m, ord=2))

    P, Q, R, S = mat(3, 3), mat(4, 3), mat(3, 4), mat(4, 4)
    x = _leaf(torch.randn(batch, 3, generator=gen, dtype=dt))

    def f(z: tuple[Tensor, Tensor], x: Tensor) -> tuple[Tensor, Tensor]:
        u, w = z
        flat = w.reshape(w.shape[0], 4)
        return torch.tanh(u @ P + flat @ Q + x), (0.5 * torch.tanh(u @ R + flat @ S)).reshape(
            w.shape
        )

    z0 = (torch.zeros(batch, 3, dtype=dt), torch.zeros(batch, 2, 2, dtype=dt))
    weights = _weights([(batch, 3), (batch, 2, 2)], gen, dt)
    names = ("args[0] (x)", *(f"{n} (closed over)" for n in "PQRS"))
    return Problem(name, f, z0, (x,), (P, Q, R, S), weights, True, names)


def batch_coupled_problem(name: str, batch: int = 3, width: int = 4) -> Problem:
    """``z' = tanh(z W^T + mean_batch(z) A^T + x)``: every sample depends on the batch mean;
    x and A in args, W closed over."""
    gen, dt = _generator(3), torch.float64
    W = _leaf(_contraction(width, gen, dt, CONTRACTION / 2))
    A = _leaf(_contraction(width, gen, dt, CONTRACTION / 2))
    x = _leaf(torch.randn(batch, width, generator=gen, dtype=dt))

    def f(z: Tensor, x: Tensor, A: Tensor) -> Tensor:
        return torch.tanh(z @ W.T + z.mean(dim=0, keepdim=True) @ A.T + x)

    z0 = torch.zeros(batch, width, dtype=dt)
    weights = _weights([(batch, width)], gen, dt)
    names = ("args[0] (x)", "args[1] (A)", "W (closed over)")
    return Problem(name, f, z0, (x, A), (W,), weights, True, names)


def spd_panel() -> list[Problem]:
    """Problems whose ``I - J`` is symmetric positive definite (see the module docstring)."""
    return [
        gradient_step_problem("gradstep_f64", torch.float64),
        gradient_step_problem("gradstep_f32", torch.float32),
    ]


def gradient_step_problem(name: str, dtype: torch.dtype, batch: int = 3, width: int = 4) -> Problem:
    """``z' = z - a (tanh(z W^T + x U^T + b) W + mu z)``: one gradient step on
    ``psi(z) = sum log cosh(z W^T + x U^T + b) + mu/2 ||z||^2`` (a = 0.6, mu = 1,
    ``||W||_2 = CONTRACTION``), so ``I - J = a (W^T diag(sech^2) W + mu I)`` is symmetric
    positive definite and J's eigenvalues lie in [0.3, 0.4]. x (B, 3) in args; W, U, b closed
    over."""
    gen, step, mu = _generator(4), 0.6, 1.0
    W = _leaf(_contraction(width, gen, dtype, CONTRACTION))
    U = _leaf(0.5 * torch.randn(width, 3, generator=gen, dtype=torch.float64).to(dtype))
    b = _leaf(0.3 * torch.randn(width, generator=gen, dtype=torch.float64).to(dtype))
    x = _leaf(torch.randn(batch, 3, generator=gen, dtype=torch.float64).to(dtype))

    def f(z: Tensor, x: Tensor) -> Tensor:
        return z - step * (torch.tanh(z @ W.T + x @ U.T + b) @ W + mu * z)

    weights = _weights([(batch, width)], gen, dtype)
    names = ("args[0] (x)", "W (closed over)", "U (closed over)", "b (closed over)")
    z0 = torch.zeros(batch, width, dtype=dtype)
    return Problem(name, f, z0, (x,), (W, U, b), weights, dtype == torch.float64, names)
