"""Overhead of DiagnosticsCallback on a training step of a tiny MLP-DEQ (CPU).

Trains the same model under several callback settings, interleaved in rounds so that machine
noise hits every setting alike, and prints the median and mean step time of each and their
overhead against training without the callback. The mean includes the logged steps (the
amortised cost); the median is the cost of an ordinary step. ``in_callback`` is the mean time
per step spent inside the callback's own calls (robust to machine noise, but without the small
cost of the hooks during a logged step's forward and backward).

    python -m experiments.benchmarks.diagnostics [--steps 250] [--rounds 4]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import cast

import torch
from torch import nn

import implicit_ham as ih
from experiments.engine.file_sinks import CSVSink, JSONLSink
from implicit_ham.diagnostics import DiagnosticsCallback, MultiSink, format_table


class DEQLayer(nn.Module):
    """z = tanh(W z + x): an implicit layer with a settable backward mode."""

    def __init__(
        self, width: int, adjoint: ih.plugins.Adjoint, solver: ih.plugins.FixedPointSolver
    ) -> None:
        super().__init__()
        self.lin = nn.Linear(width, width)
        with torch.no_grad():
            self.lin.weight.mul_(0.5)
        self.adjoint = adjoint
        self.solver = solver
        self.last_solution: ih.Solution | None = None

    def step(self, z: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.lin(z) + x)

    def implicit_problem(self, x: torch.Tensor) -> ih.FixedPointProblem:
        return ih.FixedPointProblem(self.step, torch.zeros_like(x), (x,))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.last_solution = self.implicit_problem(x).solve(self.solver, self.adjoint)
        return cast(torch.Tensor, self.last_solution.value)  # z0 is one tensor, so is the value


def make_model(width: int = 64, inputs: int = 32, classes: int = 10) -> nn.Module:
    """Encoder -> DEQ layer (15 plain iterations, implicit GMRES backward) -> classifier."""
    deq = DEQLayer(width, ih.Implicit(max_steps=30, tol=1e-4), ih.FixedPointIteration(15))
    return nn.Sequential(nn.Linear(inputs, width), deq, nn.Linear(width, classes))


@dataclass
class Setting:
    """A callback configuration to time (None: no callback)."""

    name: str
    make: Callable[[nn.Module, torch.optim.Optimizer, str], DiagnosticsCallback | None]


def time_steps(
    setting: Setting, steps: int, warmup: int, seed: int
) -> tuple[list[float], list[float]]:
    """Train a fresh model for ``warmup + steps`` steps; return the timed steps' seconds and
    the seconds spent inside the callback's calls in each of them."""
    torch.manual_seed(seed)
    model = make_model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    teacher = torch.randn(32, 10)
    with tempfile.TemporaryDirectory() as out:
        cb = setting.make(model, opt, out)
        times, inside = [], []
        for step in range(warmup + steps):
            x = torch.randn(64, 32)
            y = (x @ teacher).argmax(dim=1)
            start = time.perf_counter()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            spent = 0.0
            if cb is not None:
                mark = time.perf_counter()
                cb.on_backward(step)
                spent += time.perf_counter() - mark
            opt.step()
            opt.zero_grad()
            if cb is not None:
                mark = time.perf_counter()
                cb.on_step(step, {"loss": loss.detach()})
                spent += time.perf_counter() - mark
            if step >= warmup:
                times.append(time.perf_counter() - start)
                inside.append(spent)
        if cb is not None:
            cb.close()
            cb.sink.close()
    return times, inside


def _callback(every: int, conditioning_every: int | None = None) -> Callable:
    def make(model: nn.Module, opt: torch.optim.Optimizer, out: str) -> DiagnosticsCallback:
        sinks = MultiSink([JSONLSink(out), CSVSink(out)])
        return DiagnosticsCallback(
            model, sinks, every=every, optimizer=opt, conditioning_every=conditioning_every
        )

    return make


SETTINGS = [
    Setting("no callback", lambda model, opt, out: None),
    Setting("every=50 (default)", _callback(50)),
    Setting("every=50, conditioning every 250", _callback(50, 250)),
    Setting("every=1 (worst case)", _callback(1)),
]


def main(argv: Sequence[str] | None = None) -> None:
    """Time the diagnostics callback's settings (interleaved rounds) and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=250, help="timed steps per setting and round")
    parser.add_argument("--warmup", type=int, default=20, help="untimed steps first")
    parser.add_argument("--rounds", type=int, default=4, help="interleaved repetitions")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    pooled: dict[str, list[float]] = {s.name: [] for s in SETTINGS}
    in_callback: dict[str, list[float]] = {s.name: [] for s in SETTINGS}
    for round_ in range(args.rounds):
        shift = round_ % len(SETTINGS)  # rotate the order so no setting always runs first
        for setting in SETTINGS[shift:] + SETTINGS[:shift]:
            times, inside = time_steps(setting, args.steps, args.warmup, seed=round_)
            pooled[setting.name] += times
            in_callback[setting.name] += inside
    base_median = statistics.median(pooled["no callback"])
    base_mean = statistics.fmean(pooled["no callback"])
    rows = []
    for name, times in pooled.items():
        median, mean = statistics.median(times), statistics.fmean(times)
        rows.append(
            {
                "setting": name,
                "steps": len(times),
                "median_ms": 1e3 * median,
                "mean_ms": 1e3 * mean,
                "overhead_median_%": 100 * (median / base_median - 1),
                "overhead_mean_%": 100 * (mean / base_mean - 1),
                "in_callback_ms": 1e3 * statistics.fmean(in_callback[name]),
                "in_callback_%": 100 * statistics.fmean(in_callback[name]) / mean,
            }
        )
    print(
        f"MLP-DEQ (width 64, batch 64, 15 forward iterations, implicit GMRES backward), "
        f"torch {torch.__version__}, 1 CPU thread"
    )
    print(format_table(rows))


if __name__ == "__main__":
    main()
