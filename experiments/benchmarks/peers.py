"""The library side by side with its peers, in one process: issue 15's targets, each with its ratio.

Peers, all run in the same process and the same interleaved rounds as the library's code:

* the official Hamburger formulation of the NMF / VQ / CD hams
(``experiments.benchmarks.official_hams``,
  a plain re-implementation of the official code's equations: ``torch.bmm`` loops,
  ``F.normalize``, softmax, ``no_grad`` over the K steps, then ``compute_coef`` with gradient);
* torchdeq 0.1.0 (a dependency): its Anderson and Broyden solvers on a dense and a convolutional
  DEQ, and a whole DEQ training step with ``get_deq(ift=True)``;
* the previous GMRES of this library (a growing list of basis vectors stacked four times per
  Arnoldi step, ``torch.linalg.lstsq`` and two host reads per step), kept here as
  ``StackedGMRES`` to measure one backward solve on the README's NMF problem.

Every ratio is peer time / library time (above 1: the library is faster), from medians over
``--rounds`` interleaved rounds on one thread (``--threads``). For the hams it also reports the
matmul floor: the same matrix products as the official formulation (recorded from it with a
dispatch mode and replayed on tensors of the same shapes and strides), timed in the same
rounds; ``floor/ours`` says how close a ham gets to it. Memory: bytes autograd saves for the
backward pass of a training step, library over peer.

    python -m experiments.benchmarks.peers                                  # all targets, ~5 min
    python -m experiments.benchmarks.peers --markdown docs/benchmarks_peers.md   # also the docs
    page
    python -m experiments.benchmarks.peers --only hams --sizes 64           # one group
    python -m experiments.benchmarks.peers --json runs/1/peers.json          # the rows as JSON

Before timing, every case checks that both sides compute the same thing: the hams' outputs and
input gradients from the same initial bases (``check_same``: relative difference below the
case's tolerance, else ``SystemExit`` naming the case), the solvers' residuals, the DEQ step's
dL/dW.

**The JSON row format** (``--json``), shared by every section of the peer page, whichever
virtualenv produced it (this module; ``experiments.benchmarks.peers_loops`` in the TorchOpt
virtualenv; the optimisation-layer sections for Theseus / TorchOpt in their own files): one
file per section run,

    {"section": "hams",                       # a short name of the section
     "meta": {"command": "...", "torch": "2.13.0+cpu", "threads": 1, "clock": "cpu",
              "rounds": 15, "load": "load average: ...", "python": "/path/to/bin/python"},
     "rows": [{"target": "1. NMF ham forward", "case": "1x512x64^2 r64 K6",
               "peer": "official formulation", "ours_ms": 59.1, "peer_ms": 57.2,
               "ratio": 0.97, "goal": ">= 1.1", "met": "yes" | "no", "notes": "...",
               "floor_ms": 61.8}]}           # floor_ms optional: the matmul floor

``ratio`` is peer / ours for a time (above 1: ours is faster) and ours / peer for a memory row
(``goal`` then reads ``<= 1``); ``met`` compares it with ``goal``. A row is identified on the page
by ``(target, case, peer)``; ``write_json`` writes a section, ``read_json`` reads one, and
``python -m experiments.bench page --peers-runs DIR1 DIR2`` merges every ``*.json`` of each
run's folder into ``docs/benchmarks_peers.md`` with the runs' ratios side by side
(``experiments.benchmarks.page.write_peer_page``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode
from torchdeq import get_deq
from torchdeq.solver import anderson_solver, broyden_solver

import implicit_ham as ih
from experiments.benchmarks.official_hams import OFFICIAL
from experiments.benchmarks.peers_rows import (
    CLOCK,
    COLUMNS,
    Table,
    _clock,
    check_same,
    medians,
    read_json,
    run_meta,
    write_json,
)
from experiments.reports.render import Table as MarkdownTable
from experiments.reports.render import render
from implicit_ham._core.state import StateSpec
from implicit_ham.diagnostics.measure import SavedTensorBytes
from implicit_ham.linalg.operator import AdjointOperator, LinearSolve, LinearSolver

GROUPS = ("hams", "memory", "solvers", "accuracy", "gmres", "deq_train")
__all__ = ["COLUMNS", "Table", "read_json", "write_json"]


@dataclass(frozen=True)
class PeerPage:
    """What the page and the console say: the command line, the set-up (torch version,
    threads, clock, rounds) and the table."""

    command: str
    torch: str
    threads: int
    clock: str
    rounds: int
    table: MarkdownTable


# ---------------------------------------------------------------------------------- hams
MATMULS = {
    torch.ops.aten.bmm.default,
    torch.ops.aten.mm.default,
    torch.ops.aten.addmm.default,
    torch.ops.aten.baddbmm.default,
}


class MatmulRecorder(TorchDispatchMode):
    """Records every matrix product (op and its tensors' shapes and strides)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[Callable[..., Any], list[object]]] = []

    def __torch_dispatch__(
        self,
        func: Callable[..., Any],
        types: object,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        if func in MATMULS:
            layout = [
                (tuple(a.shape), a.stride(), a.dtype) if isinstance(a, Tensor) else a for a in args
            ]
            self.calls.append((func, layout))
        return func(*args, **(kwargs or {}))


def matmul_floor(fn: Callable[[], object]) -> Callable[[], None]:
    """A function running the matrix products ``fn`` runs (same shapes, strides) and nothing
    else: the floor of ``fn``'s time."""
    recorder = MatmulRecorder()
    with recorder:
        fn()
    replay = [
        (func, [_strided(a) if isinstance(a, tuple) else a for a in layout])
        for func, layout in recorder.calls
    ]

    def run() -> None:
        for func, args in replay:
            func(*args)

    return run


def _strided(layout: tuple[tuple[int, ...], tuple[int, ...], torch.dtype]) -> Tensor:
    """A random tensor with the given shape, strides (zero strides included) and dtype."""
    shape, stride, dtype = layout
    extent = 1 + sum((size - 1) * step for size, step in zip(shape, stride, strict=True))
    return torch.rand(max(extent, 1), dtype=dtype).as_strided(shape, stride)


def ham_cases(
    name: str, size: int, channels: int, rank: int, steps: int
) -> tuple[dict[tuple[str, str], Callable[[], object]], dict[str, int]]:
    """The timed cases ((who, "forward" | "train") -> step: the library's ham, the official
    formulation and its matmul floor) and the bytes each side saves for backward."""
    ours = ih.make_decomposition(name, rank=rank, steps=steps, eval_steps=steps)
    official = OFFICIAL[name](rank=rank, steps=steps, eval_steps=steps)
    gen = torch.Generator().manual_seed(size)
    draw = torch.rand if ours.nonnegative else torch.randn
    x = draw((1, channels, size, size), generator=gen)
    x_grad = x.clone().requires_grad_()
    cases: dict[tuple[str, str], Callable[[], object]] = {}
    for label, module in (("ours", ours), ("official", official)):

        def forward(module: nn.Module = module) -> None:
            module.eval()
            with torch.no_grad():
                module(x)
            module.train()

        def train(module: nn.Module = module) -> None:
            x_grad.grad = None
            module(x_grad).sum().backward()

        cases[(label, "forward")] = forward
        cases[(label, "train")] = train
    cases[("floor", "forward")] = matmul_floor(cases[("official", "forward")])
    cases[("floor", "train")] = matmul_floor(cases[("official", "train")])
    memory: dict[str, int] = {}
    for label, module in (("ours", ours), ("official", official)):
        counter = SavedTensorBytes()
        x_grad.grad = None
        with counter.track():
            loss = module(x_grad).sum()
        del loss
        memory[label] = counter.total
    return cases, memory


def ham_agreement(name: str, size: int, channels: int, rank: int, steps: int) -> float:
    """Output and input-gradient agreement of the library's ham and the official formulation
    from the same initial bases (relative; checked before timing)."""
    ours = ih.make_decomposition(name, rank=rank, steps=steps, eval_steps=steps)
    official = OFFICIAL[name](rank=rank, steps=steps, eval_steps=steps)
    gen = torch.Generator().manual_seed(size + 1)
    draw = torch.rand if ours.nonnegative else torch.randn
    x = draw((1, channels, size, size), generator=gen, dtype=torch.float64)
    bases = F.normalize(torch.rand(1, channels, rank, generator=gen, dtype=torch.float64), dim=1)
    outputs, grads = [], []
    for module in (ours, official):
        xg = x.clone().requires_grad_()
        with torch.random.fork_rng():
            out = module(xg, init=bases) if module is ours else _official_from(module, xg, bases)
        out.square().sum().backward()
        outputs.append(out)
        grads.append(cast(Tensor, xg.grad))
    return check_same(f"{name} ham {size}^2 (output, dx)", outputs[:1] + grads[:1],
                      outputs[1:] + grads[1:], 1e-8)


def _official_from(module: nn.Module, x: Tensor, bases: Tensor) -> Tensor:
    """The official formulation's forward with given initial bases."""
    batch, channels, height, width = x.shape
    flat = x.view(batch, channels, height * width)
    state = module.local_inference(flat, bases)  # type: ignore[operator]
    coef = module.compute_coef(flat, *state)  # type: ignore[operator]
    return torch.bmm(state[0], coef.transpose(1, 2)).view(batch, channels, height, width)


def measure_hams(table: Table, sizes: Sequence[int], rounds: int, channels: int = 512,
                 rank: int = 64, steps: int = 6) -> None:
    for size in sizes:
        for name in ("nmf", "vq", "cd"):
            agree = ham_agreement(name, size, channels, rank, steps)
            cases, memory = ham_cases(name, size, channels, rank, steps)
            times = medians({f"{a}/{b}": fn for (a, b), fn in cases.items()}, rounds)
            mem = memory["ours"] / memory["official"]
            for what in ("forward", "train"):
                ours, peer, floor = (times[f"{w}/{what}"] for w in ("ours", "official", "floor"))
                notes = f"floor {floor:.1f} ms = {100 * floor / ours:.0f}% of ours"
                notes += f"; float64 output / dx agree to {agree:.0e}"
                if what == "train":
                    notes += f"; saved bytes ours/official {mem:.2f}"
                case = f"1x{channels}x{size}^2 r{rank} K{steps}"
                goal = 1.3 if what == "train" and name != "nmf" else 1.1
                table.add(f"1. {name.upper()} ham {what}", case, "official formulation", ours,
                          peer, goal, notes, floor=floor)


def _status_kib(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {key}")


def rss_probe(who: str, name: str, size: int, train: bool, channels: int = 512,
              rank: int = 64, steps: int = 6) -> int:
    """Run in a fresh process: the peak RSS increase (KiB) of three forwards (or training
    steps) of one side's ham over the RSS before them (the peak is reset through
    ``/proc/self/clear_refs`` first, so the imports' peak does not count)."""
    torch.set_num_threads(1)
    if who == "ours":
        module: nn.Module = ih.make_decomposition(name, rank=rank, steps=steps, eval_steps=steps)
    else:
        module = OFFICIAL[name](rank=rank, steps=steps, eval_steps=steps)
    draw = torch.rand if name == "nmf" else torch.randn
    x = draw((1, channels, size, size), generator=torch.Generator().manual_seed(size))
    if train:
        x.requires_grad_()
    else:
        module.eval()
    Path("/proc/self/clear_refs").write_text("5")
    before = _status_kib("VmRSS:")
    for _ in range(3):
        if train:
            x.grad = None
            module(x).sum().backward()
        else:
            with torch.no_grad():
                module(x)
    return _status_kib("VmHWM:") - before


def peak_rss(who: str, name: str, size: int, train: bool) -> int:
    """``rss_probe`` in a separate process (this interpreter, this checkout)."""
    code = ("from experiments.benchmarks.peers import rss_probe; "
            f"print(rss_probe({who!r}, {name!r}, {size}, {train}))")
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env=env, cwd=root)
    return int(out.stdout.split()[-1])


def measure_memory(table: Table, sizes: Sequence[int], repeats: int = 3) -> None:
    """Peak RSS of the NMF forward and training step, separate processes, median of
    ``repeats`` processes per side (ours / official, goal <= 1)."""
    for size in sizes:
        for train in (False, True):
            values = {who: statistics.median(peak_rss(who, "nmf", size, train)
                                             for _ in range(repeats))
                      for who in ("ours", "official")}
            what = "training step" if train else "forward"
            table.add_at_most(f"5. NMF {what} peak RSS", f"1x512x{size}^2 r64 K6",
                              "official formulation", values["ours"] / 1024,
                              values["official"] / 1024, 1.0,
                              f"MiB above the RSS before, separate processes, median of "
                              f"{repeats}")


# ------------------------------------------------------------------------------- solvers
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

    def flat(z: Tensor) -> Tensor:
        return problem.f(z.view_as(z0)).reshape(z.shape)

    def ours(solver: ih.plugins.FixedPointSolver) -> Callable[[], Tensor]:
        def run() -> Tensor:
            with torch.no_grad():
                solution = ih.fixed_point(problem.f, z0, solver=solver, adjoint=ih.Implicit())
            return cast(Tensor, solution.value)  # z0 is one tensor, so is the value

        return run

    def peer(fn: Callable[..., tuple[Tensor, ...]], **kw: object) -> Callable[[], Tensor]:
        def run() -> Tensor:
            with torch.no_grad():
                return fn(flat, z0, tol=tol, stop_mode="rel", **kw)[0].view_as(z0)

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
            notes = (f"f evals ours {counts[0]} / torchdeq {counts[1]}; final rel residual ours "
                     f"{residuals[0]:.2e} / torchdeq {residuals[1]:.2e}")
            table.add(f"2. {name.capitalize()} forward", f"{problem.name} tol {tol:g}",
                      f"torchdeq {name}", times[f"{name}/ours"], times[f"{name}/peer"], 1.1, notes)


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
    """The points ours (``Anderson``, plain and ``polish=True``) and torchdeq's
    ``anderson_solver`` (m = 5, lam = 1e-4, as ours) return after ``budget`` evaluations of
    f without a tolerance, on the conv DEQ (evaluations counted)."""
    problem = conv_problem()
    z0 = torch.zeros_like(problem.x)
    points: dict[str, Tensor] = {}
    for label, polish in (("ours", False), ("ours polish", True)):
        solver = ih.Anderson(max_steps=budget + 1, tol=None, polish=polish)
        problem.calls[0] = 0
        with torch.no_grad():
            points[label] = cast(Tensor, ih.fixed_point(problem.f, z0, solver=solver).value)
        assert problem.calls[0] == budget, (label, problem.calls[0])

    def flat(z: Tensor) -> Tensor:
        return problem.f(z.view_as(z0)).reshape(z.shape)

    problem.calls[0] = 0
    with torch.no_grad():
        points["torchdeq"] = anderson_solver(flat, z0, max_iter=budget, tol=-1.0, m=5,
                                             lam=1e-4, stop_mode="rel")[0].view_as(z0)
    assert problem.calls[0] == budget, ("torchdeq", problem.calls[0])
    return points


def measure_accuracy(table: Table, budgets: Sequence[int] = (5, 8, 12, 20)) -> None:
    """Residual and error of z and of dL/dx against float64, at equal f-evaluation budgets;
    ratio = torchdeq's error of z / ours (``polish=True``)."""
    exact, z_exact = conv_problem64()
    g_exact = implicit_gradient(exact, z_exact, steps=400)
    float32 = conv_problem()
    for budget in budgets:
        points = accuracy_points(budget)
        err = {who: float((z.double() - z_exact).norm() / z_exact.norm())
               for who, z in points.items()}
        gerr = {who: float((implicit_gradient(float32, z).double() - g_exact).norm()
                           / g_exact.norm()) for who, z in points.items()}
        res = {who: float32.residual(z) for who, z in points.items()}
        notes = "; ".join(f"{who}: z {err[who]:.1e}, dL/dx {gerr[who]:.1e}, residual "
                          f"{res[who]:.1e}" for who in points)
        table.add("6. Anderson accuracy vs float64 (rel. error of z)",
                  f"conv B8 C16 16x16, {budget} f evals", "torchdeq anderson_solver",
                  err["ours polish"], err["torchdeq"], 1.0, notes)


# --------------------------------------------------------------------------------- GMRES
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
    times = medians({"new": lambda: new.solve(op, v, steps, 1e-5),
                     "old": lambda: old.solve(op, v, steps, 1e-5)}, rounds, warmup=1)
    table.add("3. GMRES backward solve", f"README NMF d512 n4096 r64, {steps} VJPs",
              "previous GMRES (stacked basis, lstsq)", times["new"], times["old"], 1.3,
              f"rel. diff of g {diff:.1e} (the previous solve's float32 lstsq rounding)")


# ------------------------------------------------------------------------------ DEQ train
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


def deq_train_cases(
    backward: str, tol: float, b_tol: float
) -> tuple[Callable[[], Tensor], Callable[[], Tensor]]:
    """(library, torchdeq) training steps of ``TanhDEQ`` on one batch; each returns dL/dW.
    Forward: Anderson to ``tol``; backward: ``backward`` ("fixed_point" or "anderson") to
    ``b_tol``, 40 VJPs at most, on both sides."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(64, 256, generator=gen).requires_grad_()
    z0 = torch.zeros(64, 256)
    model, peer_model = TanhDEQ(), TanhDEQ()
    adjoint = ih.Implicit(linear_solver=backward, max_steps=40, tol=b_tol)
    solver = ih.Anderson(max_steps=51, tol=tol)
    deq = get_deq(f_solver="anderson", f_max_iter=50, f_tol=tol, f_stop_mode="rel",
                  b_solver="fixed_point_iter" if backward == "fixed_point" else "anderson",
                  b_max_iter=40, b_tol=b_tol, b_stop_mode="rel", ift=True)

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
    for backward in ("fixed_point", "anderson"):
        ours, peer = deq_train_cases(backward, tol, b_tol)
        mine, theirs = ours().clone(), peer().clone()
        agree = float((mine - theirs).norm() / theirs.norm())
        times = medians({"ours": ours, "peer": peer}, rounds)
        table.add("4. DEQ training step", f"dense B64 N256, Anderson fwd + {backward} bwd",
                  "torchdeq get_deq(ift=True)", times["ours"], times["peer"], 1.1,
                  f"rel. diff of dL/dW {agree:.1e}")


# ----------------------------------------------------------------------------------- main
def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10, help="interleaved rounds (median)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 128], help="ham H = W")
    parser.add_argument("--only", nargs="+", choices=GROUPS, default=list(GROUPS))
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--clock", choices=list(CLOCK), default="cpu", help="process CPU or wall")
    parser.add_argument("--markdown", default=None, help="also write the table as a page here")
    parser.add_argument("--json", default=None, help="also write the rows (JSON row format)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> Table:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    _clock[0] = CLOCK[args.clock]
    table = Table()
    warnings.simplefilter("ignore", ih.ConvergenceWarning)  # NMF's GMRES: expected, see README
    if "hams" in args.only:
        measure_hams(table, args.sizes, args.rounds)
    if "memory" in args.only:
        measure_memory(table, args.sizes)
    if "solvers" in args.only:
        measure_solvers(table, args.rounds)
    if "accuracy" in args.only:
        measure_accuracy(table)
    if "gmres" in args.only:
        measure_gmres(table, args.rounds)
    if "deq_train" in args.only:
        measure_deq_train(table, args.rounds)
    words = sys.argv[1:] if argv is None else list(argv)
    command = " ".join(["python -m experiments.benchmarks.peers", *words])
    page = PeerPage(
        command, torch.__version__, args.threads, args.clock, args.rounds, table.as_table()
    )
    print(render("benchmarks/peers_console.txt.j2", page=page), end="")
    if args.json:
        meta = run_meta(command, args.threads, args.clock, args.rounds)
        write_json(args.json, "peers", table, meta)
    if args.markdown:
        Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
        Path(args.markdown).write_text(render("benchmarks/peers.md.j2", page=page))
    return table


if __name__ == "__main__":
    main()
