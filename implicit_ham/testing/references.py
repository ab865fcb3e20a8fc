"""Independent references for the conformance checks, written from the definitions.

Nothing here calls ``fixed_point`` or a library solver: the K-step and fixed-point maps are plain
loops over ``Problem.step``, the Jacobian is ``torch.func.jacrev`` of the whole-batch map, linear
systems are solved with ``torch.linalg.solve``. All on the problem's linear loss (gradient v =
the loss weights at the solution), in the problem's dtype (float64 for the exact problems).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import Tensor

from implicit_ham.testing.problems import Problem, Structured, as_tuple

Gradient = tuple[Tensor, ...]
FD_EPS = 1e-6


def input_gradient(problem: Problem, value: Structured) -> Gradient:
    """d loss(value) / d inputs (zeros where an input is unused or ``value`` has no graph)."""
    loss = problem.loss(value)
    if not loss.requires_grad:
        return tuple(torch.zeros_like(t) for t in problem.inputs)
    grads = torch.autograd.grad(loss, problem.inputs, allow_unused=True)
    return tuple(
        torch.zeros_like(t) if g is None else g for g, t in zip(grads, problem.inputs, strict=True)
    )


def vjp_of_step(problem: Problem, z: tuple[Tensor, ...], g: tuple[Tensor, ...]) -> Gradient:
    """``(df/dθ)^T g`` at z for every input θ (z held constant)."""
    fz = problem.step(tuple(t.detach() for t in z))
    grads = torch.autograd.grad(fz, problem.inputs, g, allow_unused=True)
    return tuple(
        torch.zeros_like(t) if r is None else r for r, t in zip(grads, problem.inputs, strict=True)
    )


def detach_then_steps(problem: Problem, total: int, k: int) -> Gradient:
    """The gradient of ``total - k`` steps from z0 without gradient, then k steps with it:
    what Truncated(k) (k = 1: OneStep; k = total: Unroll) differentiates."""
    z = as_tuple(problem.z0)
    with torch.no_grad():
        for _ in range(total - k):
            z = problem.step(z)
    z = tuple(t.detach() for t in z)
    for _ in range(k):
        z = problem.step(z)
    return input_gradient(problem, problem.restore(z))


def damped_steps_from(problem: Problem, z_star: tuple[Tensor, ...], k: int, tau: float) -> Gradient:
    """Phantom(k, tau): k steps ``p <- tau f(p) + (1 - tau) p`` from z* carry the gradient."""
    p = tuple(t.detach() for t in z_star)
    for _ in range(k):
        fp = problem.step(p)
        p = tuple(tau * a + (1 - tau) * b for a, b in zip(fp, p, strict=True))
    return input_gradient(problem, problem.restore(p))


def jacobian(problem: Problem, z: tuple[Tensor, ...]) -> Tensor:
    """J (M, M) of the whole-batch map at z (all state tensors flattened and concatenated)."""
    shapes = [t.shape for t in z]
    sizes = [t.numel() for t in z]

    def flat_map(flat: Tensor) -> Tensor:
        parts = torch.split(flat, sizes)
        state = tuple(p.reshape(s) for p, s in zip(parts, shapes, strict=True))
        return torch.cat([t.reshape(-1) for t in problem.step(state)])

    flat = torch.cat([t.detach().reshape(-1) for t in z])
    with torch.no_grad():
        return torch.func.jacrev(flat_map)(flat)


def split_like(flat: Tensor, like: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
    """Inverse of flattening-and-concatenating the tensors of ``like``."""
    parts = torch.split(flat, [t.numel() for t in like])
    return tuple(p.reshape(t.shape) for p, t in zip(parts, like, strict=True))


def implicit_adjoint(problem: Problem, z_star: tuple[Tensor, ...], ridge: float = 0.0) -> Tensor:
    """g (M,) solving ``g = J^T g / (1 + ridge) + v`` densely at z* (v: the loss weights)."""
    jac = jacobian(problem, z_star)
    v = torch.cat([w.reshape(-1) for w in problem.weights])
    eye = torch.eye(jac.shape[0], dtype=jac.dtype)
    return torch.linalg.solve(eye - jac.T / (1.0 + ridge), v)


def neumann_adjoint(problem: Problem, z_star: tuple[Tensor, ...], k: int, tau: float) -> Tensor:
    """g (M,) = ``tau * sum_{i<k} (B^T)^i v`` with ``B = tau J + (1 - tau) I``, densely."""
    jac = jacobian(problem, z_star)
    v = torch.cat([w.reshape(-1) for w in problem.weights])
    b_t = (tau * jac + (1 - tau) * torch.eye(jac.shape[0], dtype=jac.dtype)).T
    term, total = v, v
    for _ in range(k - 1):
        term = b_t @ term
        total = total + term
    return tau * total


def gradient_from_adjoint(problem: Problem, z_star: tuple[Tensor, ...], g: Tensor) -> Gradient:
    """``(df/dθ)^T g`` at z* for an adjoint vector g (M,)."""
    return vjp_of_step(problem, z_star, split_like(g, z_star))


def random_directions(
    inputs: tuple[Tensor, ...], count: int, seed: int = 0
) -> list[tuple[Tensor, ...]]:
    """``count`` random perturbation directions, one tensor per input, each of unit norm."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        dirs = []
        for t in inputs:
            d = torch.randn(t.shape, generator=gen, dtype=torch.float64).to(t.dtype)
            dirs.append(d / d.norm().clamp_min(1e-30))
        out.append(tuple(dirs))
    return out


@contextmanager
def perturbed(
    inputs: tuple[Tensor, ...], directions: tuple[Tensor, ...], eps: float
) -> Iterator[None]:
    """Inside the block every input is ``input + eps * direction`` (in place; restored after)."""
    saved = [t.detach().clone() for t in inputs]
    try:
        with torch.no_grad():
            for t, d in zip(inputs, directions, strict=True):
                t.add_(eps * d)
        yield
    finally:
        with torch.no_grad():
            for t, s in zip(inputs, saved, strict=True):
                t.copy_(s)


def directional_errors(
    inputs: tuple[Tensor, ...],
    gradient: Gradient,
    evaluate: Callable[[], Tensor],
    count: int = 3,
    eps: float = FD_EPS,
    with_grad: bool = False,
) -> tuple[float, float]:
    """(relative error, reference norm) of ``<gradient, d>`` against central differences
    ``(L(θ + eps d) - L(θ - eps d)) / (2 eps)`` over ``count`` random directions d of the
    ``inputs`` (leaf tensors, perturbed in place), where ``evaluate()`` recomputes the loss
    at the current inputs (without gradient unless ``with_grad``, e.g. when the "loss" is
    itself a gradient)."""
    analytic, numeric = [], []
    for dirs in random_directions(inputs, count):
        analytic.append(sum(float((g * d).sum()) for g, d in zip(gradient, dirs, strict=True)))
        with torch.set_grad_enabled(with_grad):
            with perturbed(inputs, dirs, eps):
                up = float(evaluate())
            with perturbed(inputs, dirs, -eps):
                down = float(evaluate())
        numeric.append((up - down) / (2 * eps))
    a = torch.tensor(analytic, dtype=torch.float64)
    n = torch.tensor(numeric, dtype=torch.float64)
    norm = float(n.norm())
    return float((a - n).norm()) / max(norm, 1e-30), norm


def relative_error(got: Gradient, expected: Gradient) -> float:
    """``||got - expected|| / ||expected||`` over all inputs together."""
    pairs = [(a.detach(), b.detach()) for a, b in zip(got, expected, strict=True)]
    diff = torch.cat([(a - b).reshape(-1).double() for a, b in pairs])
    ref = torch.cat([b.reshape(-1).double() for _, b in pairs])
    return float(diff.norm()) / max(float(ref.norm()), 1e-300)
