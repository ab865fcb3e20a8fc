"""Anderson's defaults against plain iteration: the table of ``docs/solvers.md``.

Each problem is solved by ``FixedPointIteration``, by ``Anderson`` with torchdeq's mixing
(``relative_lam=False, restart=None``: an absolute ``lam`` and no restart, the defaults before
issue 45 item 9), by ``Anderson`` with its defaults (a ``lam`` relative to the history's mean
squared residual, and a restart when the newest residual exceeds the smallest of the history)
and by ``Broyden``, all without gradient. Per cell: the evaluations of ``f`` the solve spent
(counted by a wrapped ``f``), the worst sample's final relative residual at the returned
point and, for the fixed budgets, the first evaluation whose worst relative residual is at
most 1e-6.

The problems: the quick-start tanh cell of ``docs/getting-started.md`` (seeded) and a wider
tanh cell at ``||W||_2 = 1.5``, solved to ``tol=1e-5``; the first decomposition layer of the
training model with ``context=vq``, ``cd`` and ``nmf`` on a validation batch, in float64, at a
fixed budget of 60 evaluations, as ``python -m experiments.convergence`` builds them.

    python -m experiments.benchmarks.anderson_defaults                      # print the table
    python -m experiments.benchmarks.anderson_defaults --write docs/solvers.md
"""

from __future__ import annotations

import argparse
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

import implicit_ham as ih
from experiments.reports.render import Table, replace_between

BEGIN, END = "<!-- anderson-table:begin -->", "<!-- anderson-table:end -->"
REACH = 1e-6


@dataclass(frozen=True)
class Case:
    """A problem and the budget it is solved with (``tol`` None: a fixed budget)."""

    name: str
    problem: ih.FixedPointProblem
    tol: float | None
    max_steps: int


def solvers(case: Case) -> dict[str, ih.plugins.FixedPointSolver]:
    """The four solvers of a row, on the case's budget."""
    steps, tol = case.max_steps, case.tol
    return {
        "FixedPointIteration": ih.FixedPointIteration(steps, tol, trace=True),
        "Anderson, torchdeq's mixing": ih.Anderson(steps, tol, relative_lam=False, restart=None),
        "Anderson (defaults)": ih.Anderson(steps, tol),
        "Broyden": ih.Broyden(steps, tol),
    }


def tanh_case(name: str, width: int, norm: float | None, seed: int = 0) -> Case:
    """``tanh(z W^T + x)``, B = 8: the quick start's ``W = randn * 0.3 / 4`` (``norm`` None) or
    a (width, width) W scaled to spectral norm ``norm``."""
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(width, width, generator=gen)
    weight = (
        weight * 0.3 / 4
        if norm is None
        else weight * norm / torch.linalg.matrix_norm(weight, ord=2)
    )
    x = torch.randn(8, width, generator=gen)

    def f(z: Tensor, x: Tensor) -> Tensor:
        return torch.tanh(z @ weight.T + x)

    return Case(name, ih.FixedPointProblem(f, torch.zeros(8, width), (x,)), 1e-5, 200)


def ham_case(context: str) -> Case:
    """The problem of ``python -m experiments.convergence context=CONTEXT``."""
    from hydra import compose, initialize_config_dir

    from experiments.config.groups import TrainConfig, register_configs
    from experiments.config.typed import typed_config
    from experiments.studies import model_studies

    register_configs()
    conf = Path(__file__).resolve().parents[2] / "conf"
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        cfg = typed_config(compose("config", overrides=[f"context={context}"]), TrainConfig)
    ham, x = model_studies._layer_and_input(cfg)
    problem = ham.implicit_problem(x, init=model_studies._bases(ham, x))
    return Case(f"{context.upper()} layer (convergence study, float64)", problem, None, 60)


def cases() -> list[Case]:
    return [
        tanh_case("tanh cell, quick start (16 wide)", 16, None),
        tanh_case("tanh cell, 64 wide, W of spectral norm 1.5", 64, 1.5),
        ham_case("vq"),
        ham_case("cd"),
        ham_case("nmf"),
    ]


def measure(case: Case, solver: ih.plugins.FixedPointSolver) -> dict[str, Any]:
    """Evaluations, final worst relative residual and first evaluation reaching ``REACH``."""
    calls = [0]

    def counted(z: Any, *args: Any) -> Any:
        calls[0] += 1
        return case.problem.f(z, *args)

    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", ih.ConvergenceWarning)
        sol = ih.fixed_point(counted, case.problem.z0, *case.problem.args, solver=solver)
        trace = ih.diagnostics.convergence_trace(case.problem, solver)
    reach = int(ih.diagnostics.steps_to_tolerance(trace.rel_residuals.amax(dim=1)[:, None], REACH))
    return {
        "evaluations": calls[0],
        "residual": float(sol.stats.rel_residual.max()),
        "reach": None if reach < 0 else reach,
    }


def table() -> str:
    """The markdown table, with its caption."""
    rows = []
    for case in cases():
        for label, solver in solvers(case).items():
            m = measure(case, solver)
            reach = "" if case.tol is not None else ("never" if m["reach"] is None else m["reach"])
            budget = f"tol {case.tol:g}, max {case.max_steps}" if case.tol else f"{case.max_steps}"
            rows.append(
                {
                    "problem": case.name,
                    "budget": budget,
                    "solver": label,
                    "f evaluations": m["evaluations"],
                    "final rel. residual": f"{m['residual']:.2e}",
                    f"first eval. <= {REACH:g}": reach,
                }
            )
    caption = (
        "Evaluations of f and the worst sample's final relative residual, without gradient "
        "(generated by `python -m experiments.benchmarks.anderson_defaults --write "
        "docs/solvers.md`; deterministic on one processor; on another, float32 rounding can "
        "move a residual's last digit):"
    )
    return f"{caption}\n\n{Table.of(rows[0], [row.values() for row in rows]).markdown()}"


def write(path: Path, text: str) -> None:
    """Replace the block between the markers in ``path`` by ``text``."""
    path.write_text(replace_between(path.read_text(), f"{BEGIN}\n{text}\n{END}", BEGIN, END, path))


def main(argv: list[str] | None = None) -> int:
    """Measure and print the table; ``--write PAGE`` also puts it into the page."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--write", type=Path, default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    text = table()
    print(text)
    if args.write is not None:
        write(args.write, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
