"""The DEQ rows of ``experiments.benchmarks.peers.run`` against torchdeq 0.1.0: the native
Anderson / Broyden on a dense and a convolutional DEQ (``solvers``), residual and gradient
accuracy at equal evaluation budgets (``accuracy``) and a whole DEQ training step
(``deq_train``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import product
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchdeq import get_deq
from torchdeq.solver import anderson_solver, broyden_solver

import implicit_ham as ih
from experiments.benchmarks.peers.rows import Table, check_same, medians


@dataclass
class DEQProblem:
    """``z = tanh(layer(z) + x)`` on a batch, with an evaluation counter."""

    name: str
    layer: Callable[[Tensor], Tensor]
    x: Tensor
    calls: list[int] = field(default_factory=lambda: [0])

    def f(self, z: Tensor, x: Tensor | None = None) -> Tensor:
        self.calls[0] += 1
        return torch.tanh(self.layer(z) + (self.x if x is None else x))

    def flat(self, z: Tensor) -> Tensor:
        """``f`` of a flattened state, flattened back (the form torchdeq's solvers take)."""
        return self.f(z.view_as(self.x)).reshape(z.shape)

    def residual(self, z: Tensor) -> float:
        with torch.no_grad():
            fz = torch.tanh(self.layer(z) + self.x)
            return float(((fz - z).flatten(1).norm(dim=1) / fz.flatten(1).norm(dim=1)).max())


def dense_problem() -> DEQProblem:
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(256, 256, generator=gen)
    weight = 0.9 * weight / torch.linalg.matrix_norm(weight, ord=2)
    return DEQProblem("dense B64 N256", lambda z: z @ weight.T, torch.randn(64, 256, generator=gen))


def conv_problem(dtype: torch.dtype = torch.float32) -> DEQProblem:
    """``z = tanh(conv(z) + x)`` on (8, 16, 16, 16), drawn in float32 (then cast to ``dtype``)."""
    gen = torch.Generator().manual_seed(1)
    weight = torch.randn(16, 16, 3, 3, generator=gen)
    weight = (0.9 * weight / torch.linalg.matrix_norm(weight.flatten(1), ord=2) / 3).to(dtype)
    x = torch.randn(8, 16, 16, 16, generator=gen).to(dtype)
    return DEQProblem("conv B8 C16 16x16", lambda z: F.conv2d(z, weight, padding=1), x)


def solver_cases(
    problem: DEQProblem, tol: float, budget: int
) -> dict[str, tuple[Callable[[], Tensor], Callable[[], Tensor]]]:
    """(library, torchdeq) forward solves of ``problem`` per method, with one evaluation budget:
    torchdeq's Anderson spends max_iter evaluations, its Broyden max_iter + 1; the library's
    solvers spend max_steps - 1 without gradient."""
    z0 = torch.zeros_like(problem.x)

    def ours(solver: ih.plugins.FixedPointSolver) -> Callable[[], Tensor]:
        def run() -> Tensor:
            with torch.no_grad():
                solution = ih.fixed_point(problem.f, z0, solver=solver, adjoint=ih.Implicit())
            return cast(Tensor, solution.value)  # z0 is one tensor, so is the value

        return run

    def peer(fn: Callable[..., tuple[Tensor, ...]], **kw: object) -> Callable[[], Tensor]:
        def run() -> Tensor:
            with torch.no_grad():
                return fn(problem.flat, z0, tol=tol, stop_mode="rel", **kw)[0].view_as(z0)

        return run

    return {
        "anderson": (ours(ih.Anderson(max_steps=budget + 1, tol=tol)),
                     peer(anderson_solver, max_iter=budget, m=5, lam=1e-4)),
        "broyden": (ours(ih.Broyden(max_steps=budget + 1, tol=tol)),
                    peer(broyden_solver, max_iter=budget - 1, ls=False)),
    }  # fmt: skip


def measure_solvers(table: Table, rounds: int, tol: float = 1e-5, budget: int = 50) -> None:
    for problem in (dense_problem(), conv_problem()):
        cases = solver_cases(problem, tol, budget)
        info = {}
        for name, pair in cases.items():
            counts, residuals = [], []
            for fn in pair:
                problem.calls[0] = 0
                z = fn()
                counts.append(problem.calls[0])
                residuals.append(problem.residual(z))
            info[name] = (counts, residuals)
        flat_cases = {
            f"{name}/{who}": fn
            for name, pair in cases.items()
            for who, fn in zip(("ours", "peer"), pair, strict=True)
        }
        times = medians(flat_cases, rounds)
        for name, (counts, residuals) in info.items():
            notes = (
                f"f evals ours {counts[0]} / torchdeq {counts[1]}; final rel residual ours "
                f"{residuals[0]:.2e} / torchdeq {residuals[1]:.2e}"
            )
            table.add(
                f"2. {name.capitalize()} forward",
                f"{problem.name} tol {tol:g}",
                f"torchdeq {name}",
                times[f"{name}/ours"],
                times[f"{name}/peer"],
                1.1,
                notes,
            )


def conv_problem64() -> tuple[DEQProblem, Tensor]:
    """``conv_problem`` in float64 and its fixed point (Anderson to 1e-13)."""
    exact = conv_problem(torch.float64)
    solver = ih.Anderson(max_steps=300, tol=1e-13)
    with torch.no_grad():
        z = ih.fixed_point(exact.f, torch.zeros_like(exact.x), solver=solver).value
    return exact, cast(Tensor, z)


def implicit_gradient(problem: DEQProblem, z: Tensor, steps: int = 300) -> Tensor:
    """dL/dx of L = sum(z*^2) by the implicit function theorem at the point ``z`` (the same
    computation for both sides: ``g = 2 z + J^T g`` by fixed-point iteration, then
    ``dL/dx = (df/dx)^T g``), so the gradient's error is the point's."""
    x = problem.x.clone().requires_grad_()
    zg = z.detach().clone().requires_grad_()
    fz = problem.f(zg, x)
    v = 2 * z.detach()
    g = v
    for _ in range(steps):
        (jt_g,) = torch.autograd.grad(fz, zg, g, retain_graph=True)
        g = v + jt_g
    (grad_x,) = torch.autograd.grad(fz, x, g)
    return grad_x


def accuracy_points(budget: int) -> dict[str, Tensor]:
    """The points ours (``Anderson``, plain and ``polish=True``; ``FixedPointIteration`` for
    context) and torchdeq's ``anderson_solver`` (m = 5, lam = 1e-4, as ours) return after
    ``budget`` evaluations of f without a tolerance, on the conv DEQ (evaluations counted: the
    solve's own for ours, ``stats.steps``, which leaves out the one evaluation at z* that our
    native solvers add to measure a point assembled from different evaluations; every call
    for torchdeq's)."""
    problem = conv_problem()
    z0 = torch.zeros_like(problem.x)
    points: dict[str, Tensor] = {}
    solvers: dict[str, ih.plugins.FixedPointSolver] = {
        "ours": ih.Anderson(max_steps=budget, tol=None, polish=False),
        "ours polish": ih.Anderson(max_steps=budget, tol=None, polish=True),
        # context: plain iteration at the same budget (returns f of its last evaluated iterate,
        # as torchdeq's Anderson does); on a strongly contractive map mixing gains little
        "fixed point": ih.FixedPointIteration(max_steps=budget),
    }
    for label, solver in solvers.items():
        with torch.no_grad():
            solution = ih.fixed_point(problem.f, z0, solver=solver)
        points[label] = cast(Tensor, solution.value)
        _check_budget(label, solution.stats.steps, budget)
    problem.calls[0] = 0
    with torch.no_grad():
        points["torchdeq"] = anderson_solver(
            problem.flat, z0, max_iter=budget, tol=-1.0, m=5, lam=1e-4, stop_mode="rel"
        )[0].view_as(z0)
    _check_budget("torchdeq", problem.calls[0], budget)
    return points


def _check_budget(label: str, calls: int, budget: int) -> None:
    """Refuse a comparison at unequal budgets (a solver's evaluation count changed)."""
    if calls != budget:
        raise RuntimeError(f"{label} spent {calls} evaluations of f, not the budget {budget}")


def measure_accuracy(table: Table, budgets: Sequence[int] = (5, 8, 12, 20)) -> None:
    """Residual and error of z and of dL/dx against float64, at equal f-evaluation budgets;
    ratio = torchdeq's error of z / ours (``polish=True``)."""
    exact, z_exact = conv_problem64()
    g_exact = implicit_gradient(exact, z_exact, steps=400)
    float32 = conv_problem()
    for budget in budgets:
        points = accuracy_points(budget)
        err = {
            who: float((z.double() - z_exact).norm() / z_exact.norm()) for who, z in points.items()
        }
        gerr = {
            who: float((implicit_gradient(float32, z).double() - g_exact).norm() / g_exact.norm())
            for who, z in points.items()
        }
        res = {who: float32.residual(z) for who, z in points.items()}
        notes = "; ".join(
            f"{who}: z {err[who]:.1e}, dL/dx {gerr[who]:.1e}, residual {res[who]:.1e}"
            for who in points
        )
        table.add(
            "6. Anderson accuracy vs float64 (rel. error of z)",
            f"conv B8 C16 16x16, {budget} f evals",
            "torchdeq anderson_solver",
            err["ours polish"],
            err["torchdeq"],
            1.0,
            notes,
        )


class TanhDEQ(nn.Module):
    """``z* = tanh(W z* + x + b)`` with parameters W, b; loss = sum(z*^2)."""

    def __init__(self, width: int = 256) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(2)
        weight = torch.randn(width, width, generator=gen)
        self.weight = nn.Parameter(0.9 * weight / torch.linalg.matrix_norm(weight, ord=2))
        self.bias = nn.Parameter(torch.zeros(width))

    def f(self, z: Tensor, x: Tensor) -> Tensor:
        return torch.tanh(z @ self.weight.T + x + self.bias)


class ConvTanhDEQ(nn.Module):
    """``z* = tanh(conv(z*) + x + b)`` on (B, C, H, W), a 3 x 3 convolution of spectral norm
    (of its flattened weight) 0.3 and a per-channel bias; loss = sum(z*^2)."""

    def __init__(self, channels: int = 16) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(2)
        weight = torch.randn(channels, channels, 3, 3, generator=gen)
        weight = 0.9 * weight / torch.linalg.matrix_norm(weight.flatten(1), ord=2) / 3
        self.weight = nn.Parameter(weight)
        self.bias = nn.Parameter(torch.zeros(channels, 1, 1))

    def f(self, z: Tensor, x: Tensor) -> Tensor:
        return torch.tanh(F.conv2d(z, self.weight, padding=1) + x + self.bias)


# the DEQ training-step problems: (model class, input shape)
DEQ_TRAIN_PROBLEMS: dict[str, tuple[type[TanhDEQ] | type[ConvTanhDEQ], tuple[int, ...]]] = {
    "dense B64 N256": (TanhDEQ, (64, 256)),
    "conv B8 C16 16x16": (ConvTanhDEQ, (8, 16, 16, 16)),
}


def deq_train_cases(
    backward: str, tol: float, b_tol: float, problem: str = "dense B64 N256"
) -> tuple[Callable[[], Tensor], Callable[[], Tensor]]:
    """(library, torchdeq) training steps of a ``DEQ_TRAIN_PROBLEMS`` model on one batch; each
    returns dL/dW. Forward: Anderson to ``tol``; backward: ``backward`` ("fixed_point" or
    "anderson") to ``b_tol``, 40 VJPs at most, on both sides."""
    model_class, shape = DEQ_TRAIN_PROBLEMS[problem]
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(*shape, generator=gen).requires_grad_()
    z0 = torch.zeros(*shape)
    model, peer_model = model_class(), model_class()
    adjoint = ih.Implicit(linear_solver=backward, max_steps=40, tol=b_tol)
    solver = ih.Anderson(max_steps=51, tol=tol)
    deq = get_deq(
        f_solver="anderson",
        f_max_iter=50,
        f_tol=tol,
        f_stop_mode="rel",
        b_solver="fixed_point_iter" if backward == "fixed_point" else "anderson",
        b_max_iter=40,
        b_tol=b_tol,
        b_stop_mode="rel",
        ift=True,
    )

    def ours() -> Tensor:
        model.zero_grad(set_to_none=True)
        x.grad = None
        sol = ih.fixed_point(model.f, z0, x, solver=solver, adjoint=adjoint)
        cast(Tensor, sol.value).square().sum().backward()  # z0 is one tensor, so is the value
        return cast(Tensor, model.weight.grad)  # set by the backward pass

    def peer() -> Tensor:
        peer_model.zero_grad(set_to_none=True)
        x.grad = None
        z_out, _ = deq(lambda z: peer_model.f(z, x), z0)
        z_out[-1].square().sum().backward()
        return cast(Tensor, peer_model.weight.grad)  # set by the backward pass

    return ours, peer


def measure_deq_train(table: Table, rounds: int, tol: float = 1e-5, b_tol: float = 1e-6) -> None:
    """A whole training step (forward solve, loss, implicit backward) on the dense and the
    convolutional DEQ, after checking that both sides' dL/dW agree (the rel. difference is in
    the notes); the conv rows' goal is the issue's 1.2."""
    for problem, backward in product(DEQ_TRAIN_PROBLEMS, ("fixed_point", "anderson")):
        ours, peer = deq_train_cases(backward, tol, b_tol, problem)
        agree = check_same(f"DEQ training step {problem} {backward}", [ours().clone()],
                           [peer().clone()], 1e-4)  # fmt: skip
        times = medians({"ours": ours, "peer": peer}, rounds)
        table.add(
            "4. DEQ training step",
            f"{problem}, Anderson fwd + {backward} bwd",
            "torchdeq get_deq(ift=True)",
            times["ours"],
            times["peer"],
            1.2 if problem.startswith("conv") else 1.1,
            f"rel. diff of dL/dW {agree:.1e}",
        )
