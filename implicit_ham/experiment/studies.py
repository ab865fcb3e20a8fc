"""The no-training jobs: gradient study and convergence study of a model's implicit layer.

Both build the configured model (at initialisation, or from ``checkpoint``), run one validation
batch through it to capture the input of its first implicit layer (a decomposition), and study
that layer's fixed-point problem with a fixed initial state, so every mode sees the same problem.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from hydra.utils import instantiate
from torch import Tensor, nn

from ..adjoints import Implicit, Neumann, OneStep, Phantom, Truncated, Unroll
from ..decompositions.base import Decomposition
from ..diagnostics import (
    compare_adjoints,
    convergence_rows,
    estimate_conditioning,
    grad_vs_k,
    plot_grad_vs_k,
    plot_residuals,
)
from ..diagnostics.measure import fork_rng_on
from ..fixed_point import FixedPointProblem
from ..solvers import Anderson, Broyden, FixedPointIteration
from .build import build_context, build_datasets, build_model, context_channels
from .results import write_results
from .train import seed_everything

logger = logging.getLogger(__name__)

STUDY_ADJOINTS = (OneStep(), Truncated(2), Phantom(3, 0.5), Neumann(10, 0.8), Implicit())


def run_grad_study(cfg: Mapping[str, Any], output_dir: str | Path) -> dict[str, Any]:
    """Gradient fidelity of every backward mode (against Unroll through the layer's K steps),
    gradient norm and cosine to the fixed-point gradient vs K, and conditioning of I - J at the
    K-step and at a converged solution. Writes tables (JSONL), a PNG and results.json."""
    output_dir = Path(output_dir)
    ham, x_ham = _layer_and_input(cfg)
    study = cfg["study"]
    weight = torch.randn_like(x_ham)  # the layer's output has its input's shape

    def layer_output(adjoint: Any, x: Tensor) -> Tensor:
        ham.adjoint = adjoint
        return ham(x, init=_bases(ham, x))

    fidelity = compare_adjoints(
        layer_output,
        (x_ham,),
        lambda y: (weight * y).sum(),
        list(STUDY_ADJOINTS),
        reference=Unroll(),
    )
    problem = _leaf_problem(ham.implicit_problem(x_ham[:1], init=_bases(ham, x_ham[:1])))
    state_weights = [torch.randn_like(t) for t in problem.z0]
    by_k = grad_vs_k(
        problem,
        lambda z: sum((w * t).sum() for w, t in zip(state_weights, z, strict=True)),
        list(study["ks"]),
        {"unroll": Unroll(), "one_step": OneStep(), "phantom(3,0.5)": Phantom(3, 0.5)},
        reference_solver=FixedPointIteration(max_steps=study["reference_steps"]),
    )
    plot_grad_vs_k(by_k, path=output_dir / "grad_vs_k.png")
    conditioning = _conditioning(ham, problem, study) if study["conditioning"] else []
    results = {
        "status": "ok",
        "config": dict(cfg),
        "fidelity": list(fidelity),
        "grad_vs_k": list(by_k),
        "conditioning": conditioning,
    }
    logger.info("gradient fidelity\n%s", fidelity)
    logger.info("gradient vs K\n%s", by_k)
    write_results(output_dir, results)
    return results


def run_convergence(cfg: Mapping[str, Any], output_dir: str | Path) -> dict[str, Any]:
    """Residual and objective traces of the layer's problem under plain iteration, Anderson and
    Broyden (``study.max_steps`` each). Writes a PNG, the rows and results.json."""
    output_dir = Path(output_dir)
    ham, x_ham = _layer_and_input(cfg)
    problem = ham.implicit_problem(x_ham, init=_bases(ham, x_ham))
    steps = int(cfg["study"]["max_steps"])
    solvers = {
        "fixed_point": FixedPointIteration(max_steps=steps),
        "anderson": Anderson(max_steps=steps, tol=None),
        "broyden": Broyden(max_steps=steps, tol=None),
    }
    x_flat = problem.args[0]
    rows, traces = convergence_rows(problem, solvers, objective=lambda z: ham.objective(x_flat, z))
    plot_residuals(traces, path=output_dir / "residuals.png")
    logger.info("convergence\n%s", rows)
    results = {"status": "ok", "config": dict(cfg), "convergence": list(rows)}
    write_results(output_dir, results)
    return results


def _layer_and_input(cfg: Mapping[str, Any]) -> tuple[Decomposition, Tensor]:
    """The first decomposition of the configured model and its input on a validation batch,
    in float64 (the studies compare gradients to high precision)."""
    seed_everything(int(cfg["seed"]))
    _, val_set, info = build_datasets(cfg["data"])
    solver, adjoint = instantiate(dict(cfg["solver"])), instantiate(dict(cfg["adjoint"]))
    context = build_context(cfg["context"], context_channels(info, cfg["model"]), solver, adjoint)
    model = build_model(info, context, cfg["model"])
    if cfg.get("checkpoint"):
        state = torch.load(cfg["checkpoint"], map_location="cpu", weights_only=True)
        model.load_state_dict(state["model"])
    model = model.double().eval()
    ham = next((m for m in model.modules() if isinstance(m, Decomposition)), None)
    if ham is None:
        raise ValueError(
            f"context {cfg['context']['name']!r} has no decomposition layer to study; choose "
            "context=nmf, vq, cd or svd"
        )
    captured: list[Tensor] = []
    handle = ham.register_forward_pre_hook(lambda _m, args: captured.append(args[0].detach()))
    batch = torch.stack([val_set[i][0] for i in range(int(cfg["study"]["samples"]))])
    with torch.no_grad():
        model(batch.double())
    handle.remove()
    return ham, captured[0]


def _leaf_problem(problem: FixedPointProblem) -> FixedPointProblem:
    """The same problem with a detached z0 and X as a fresh leaf requiring grad, so it can be
    solved and differentiated many times."""
    z0 = tuple(t.detach() for t in problem.z0)
    return FixedPointProblem(problem.f, z0, (problem.args[0].detach().requires_grad_(),))


def _bases(ham: Decomposition, x: Tensor) -> Tensor:
    """Initial bases (B*S, d, r) for ``x`` (B, C, H, W) drawn from the layer's own distribution
    under a forked RNG seeded 0: the same for every mode, the global RNG untouched."""
    flat = ham.flatten(x)
    with fork_rng_on(x.device):
        torch.manual_seed(0)
        raw = ham.sample_bases((flat.shape[0], flat.shape[1], ham.rank), flat)
    return nn.functional.normalize(raw, dim=1)


def _conditioning(ham: Decomposition, problem: Any, study: Mapping[str, Any]) -> list[dict]:
    rows = []
    for label, steps in (("K steps", ham.eval_steps), ("converged", study["reference_steps"])):
        with torch.no_grad():
            sol = problem.solve(FixedPointIteration(max_steps=steps), Implicit())
        report = estimate_conditioning(problem.f, sol.value, *problem.args)
        rows.append({"point": label, "steps": steps, **report.as_dict()})
    return rows
