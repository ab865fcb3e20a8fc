"""The no-training jobs: gradient study and convergence study of a model's implicit layer.

Both build the configured model (at initialisation, or from ``checkpoint``), run one validation
batch through it to capture the input of its first implicit layer (a decomposition), and study
that layer's fixed-point problem with a fixed initial state, so every mode sees the same problem.
Losses are taken on the layer's readout ``D C^T``, which is invariant under the
re-parametrisations of (D, C) that leave it unchanged (NMF's scaling symmetry), so every
gradient compared is well defined. With a ``checkpoint``, the convergence study also
evaluates the trained model with other forward solvers (does a converged solve help?).
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from hydra.utils import instantiate
from torch import Tensor, nn

from experiments.config.groups import StudyConf, TrainConfig
from experiments.config.typed import as_container
from experiments.data.factory import TaskInfo
from experiments.engine.build import (
    build_context,
    build_datasets,
    build_loaders,
    build_model,
    context_channels,
)
from experiments.engine.checkpoint import read_checkpoint
from experiments.engine.results import write_results
from experiments.engine.run import seed_everything
from experiments.engine.task import Task, evaluate
from experiments.studies.task_gradients import task_gradient_rows
from implicit_ham.adjoints.modes import Implicit, Neumann, OneStep, Phantom, Truncated, Unroll
from implicit_ham.decompositions.base import Decomposition
from implicit_ham.diagnostics import (
    compare_adjoints,
    convergence_rows,
    estimate_conditioning,
    grad_vs_k,
    plot_grad_vs_k,
    plot_residuals,
)
from implicit_ham.diagnostics.measure import fork_rng_on
from implicit_ham.errors import ConditioningWarning, ConvergenceWarning
from implicit_ham.problems.fixed_point import FixedPointProblem
from implicit_ham.solvers.accelerated import Anderson, Broyden
from implicit_ham.solvers.base import FixedPointSolver
from implicit_ham.solvers.iteration import FixedPointIteration

logger = logging.getLogger(__name__)

STUDY_ADJOINTS = (OneStep(), Truncated(2), Phantom(3, 0.5), Neumann(10, 0.8), Implicit())
GRAD_VS_K_ADJOINTS = {
    "unroll": Unroll(),
    "one_step": OneStep(),
    "truncated(2)": Truncated(2),
    "phantom(3,0.5)": Phantom(3, 0.5),
    "implicit": Implicit(max_steps=30),
    "implicit(ridge=0.1)": Implicit(max_steps=30, ridge=0.1),
}


def run_grad_study(cfg: TrainConfig, output_dir: str | Path) -> dict[str, Any]:
    """Gradient fidelity of every backward mode (against Unroll through the layer's K steps);
    gradient norm vs K with its cosine to the reference gradient (Unroll through
    ``study.reference_steps`` iterations) and to the exact gradient of the K-step map (Unroll at
    the same K), on the layer's raw fixed-point problem (there "one_step" differentiates the
    last iteration, bases included); the same on the task loss over labelled pixels with the
    training arms' modes (``task_grad``: the paper's one-step with detached bases, the one-step
    through the bases, ...; see ``experiments.studies.task_gradients``); conditioning of I - J at
    the
    K-step and at a converged solution. Writes a PNG and results.json."""
    output_dir = Path(output_dir)
    start = time.perf_counter()
    ham, x_ham = _layer_and_input(cfg)
    study = cfg.study
    task_grad = _task_gradients(cfg)
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
    x_flat, z0 = problem.args[0], problem.z0
    assert isinstance(z0, tuple) and len(z0) == 2  # a decomposition's state (D, C)
    with torch.no_grad():
        readout_weight = torch.randn_like(ham.readout(x_flat, z0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        warnings.simplefilter("ignore", ConditioningWarning)
        by_k = grad_vs_k(
            problem,
            lambda z: (readout_weight * ham.readout(x_flat, z)).sum(),
            list(study.ks),
            GRAD_VS_K_ADJOINTS,
            reference=Unroll(),
            reference_solver=FixedPointIteration(max_steps=study.reference_steps),
            same_k=Unroll(),
        )
    plot_grad_vs_k(by_k, path=output_dir / "grad_vs_k.png")
    conditioning = _conditioning(ham, problem, study) if study.conditioning else []
    results = {
        "status": "ok",
        "config": as_container(cfg),
        "fidelity": list(fidelity),
        "grad_vs_k": list(by_k),
        "conditioning": conditioning,
        "task_grad": task_grad,
        "elapsed_s": time.perf_counter() - start,
    }
    logger.info("gradient fidelity\n%s", fidelity)
    logger.info("gradient vs K\n%s", by_k)
    write_results(output_dir, results)
    return results


def run_convergence(cfg: TrainConfig, output_dir: str | Path) -> dict[str, Any]:
    """Residual and objective traces of the layer's problem under plain iteration, Anderson and
    Broyden (``study.max_steps`` each). Writes a PNG, the rows and results.json."""
    output_dir = Path(output_dir)
    start = time.perf_counter()
    ham, x_ham = _layer_and_input(cfg)
    problem = ham.implicit_problem(x_ham, init=_bases(ham, x_ham))
    steps = cfg.study.max_steps
    solvers = {
        "fixed_point": FixedPointIteration(max_steps=steps),
        "anderson": Anderson(max_steps=steps, tol=None),
        "broyden": Broyden(max_steps=steps, tol=None),
    }
    x_flat = problem.args[0]
    rows, traces = convergence_rows(problem, solvers, objective=lambda z: ham.objective(x_flat, z))
    plot_residuals(traces, path=output_dir / "residuals.png")
    logger.info("convergence\n%s", rows)
    results: dict[str, Any] = {
        "status": "ok",
        "config": as_container(cfg),
        "convergence": list(rows),
        "traces": {name: _trace_summary(tr) for name, tr in traces.items()},
    }
    if cfg.checkpoint:
        results["eval_solvers"] = eval_with_solvers(cfg, _eval_solvers(ham.eval_steps))
        logger.info("trained model under other forward solvers\n%s", results["eval_solvers"])
    results["elapsed_s"] = time.perf_counter() - start
    write_results(output_dir, results)
    return results


def _trace_summary(trace: Any) -> dict[str, list[float]]:
    """Per-step relative residual (max over samples) and mean objective of a trace."""
    out = {"rel_residual": [float(v) for v in trace.rel_residuals.amax(dim=1)]}
    if trace.objective is not None:
        out["objective"] = [float(v) for v in trace.objective.mean(dim=1)]
    return out


def _eval_solvers(trained_k: int) -> dict[str, FixedPointSolver]:
    """The forward solvers a trained model is evaluated with: plain iteration at several K
    (including the trained K) and Anderson to a tolerance."""
    ks = sorted({1, 3, trained_k, 2 * trained_k, 4 * trained_k, 50})
    solvers: dict[str, FixedPointSolver] = {
        f"fixed_point K={k}": FixedPointIteration(max_steps=k) for k in ks
    }
    solvers["anderson K<=50 tol=1e-4"] = Anderson(max_steps=50, tol=1e-4)
    return solvers


def eval_with_solvers(cfg: TrainConfig, solvers: Mapping[str, FixedPointSolver]) -> list[dict]:
    """Validation metrics of the model of ``cfg`` (its ``checkpoint``) with each forward solver
    in every decomposition layer, and the layers' final relative residual (max over layers and
    batches). The RNG is re-seeded before each evaluation, so random initial bases match."""
    _, val_set, info = build_datasets(cfg.data)
    model = configured_model(cfg, info, cfg.checkpoint)
    hams = [m for m in model.modules() if isinstance(m, Decomposition)]
    _, val_loader = build_loaders(val_set, val_set, cfg.batch_size, cfg.seed)
    task = task_of(info)
    rows = []
    for label, solver in solvers.items():
        for ham in hams:
            ham.solver, ham.eval_steps = solver, solver.max_steps
        residuals: list[float] = []
        handles = [h.register_forward_hook(_record_residual(residuals)) for h in hams]
        seed_everything(cfg.seed)
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)  # the residual is recorded
            metrics = evaluate(model, val_loader, task, device=torch.device("cpu"))
        for handle in handles:
            handle.remove()
        rows.append({"solver": label, "final_rel_residual": max(residuals), **metrics})
    return rows


def _record_residual(out: list[float]) -> Callable[..., None]:
    def hook(layer: Decomposition, _args: Any, _output: Any) -> None:
        if layer.last_solution is not None:
            out.append(float(layer.last_solution.stats.rel_residual.max()))

    return hook


def _layer_and_input(cfg: TrainConfig) -> tuple[Decomposition, Tensor]:
    """The first decomposition of the configured model and its input on a validation batch,
    in float64 (the studies compare gradients to high precision)."""
    model, ham, items, _ = _studied_model(cfg)
    captured: list[Tensor] = []
    handle = ham.register_forward_pre_hook(lambda _m, args: captured.append(args[0].detach()))
    batch = torch.stack([image for image, _ in items])
    with torch.no_grad():
        model(batch.double())
    handle.remove()
    return ham, captured[0]


def _task_gradients(cfg: TrainConfig) -> list[dict[str, Any]]:
    """``task_gradients.task_gradient_rows`` on the model of ``cfg`` (float64) and the first
    ``study.samples`` validation images with their labels."""
    model, ham, items, info = _studied_model(cfg)
    inputs = torch.stack([image for image, _ in items]).double()
    target = torch.stack([torch.as_tensor(label) for _, label in items])
    study = cfg.study
    return task_gradient_rows(
        model, ham, inputs, target, task_of(info), list(study.ks), study.reference_steps
    )


def _studied_model(cfg: TrainConfig) -> tuple[nn.Module, Decomposition, list[Any], TaskInfo]:
    """The configured model in float64 (seeded by ``cfg.seed``), its first decomposition, the
    first ``study.samples`` validation (image, label) pairs and the task they come from."""
    seed_everything(cfg.seed)
    _, val_set, info = build_datasets(cfg.data)
    model = configured_model(cfg, info, cfg.checkpoint).double()
    ham = next((m for m in model.modules() if isinstance(m, Decomposition)), None)
    if ham is None:
        raise ValueError(
            f"context {cfg.context.name!r} has no decomposition layer to study; choose "
            "context=nmf, vq, cd or svd"
        )
    return model, ham, [val_set[i] for i in range(cfg.study.samples)], info


def configured_model(
    cfg: TrainConfig, info: TaskInfo, checkpoint: str | Path | None = None
) -> nn.Module:
    """The configured model in eval mode, with the weights of ``checkpoint`` (a training job's
    checkpoint file) when given."""
    solver, adjoint = instantiate(cfg.solver), instantiate(cfg.adjoint)
    context = build_context(cfg.context, context_channels(info, cfg.model), solver, adjoint)
    model = build_model(info, context, cfg.model)
    if checkpoint:
        model.load_state_dict(read_checkpoint(checkpoint)["model"])
    return model.eval()


def task_of(info: TaskInfo) -> Task:
    """The task of a dataset: its kind, classes and ignored label (-100 when it has none)."""
    ignore = -100 if info.ignore_index is None else info.ignore_index
    return Task(info.kind, info.num_classes, ignore)


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


def _conditioning(ham: Decomposition, problem: Any, study: StudyConf) -> list[dict]:
    rows = []
    for label, steps in (("K steps", ham.eval_steps), ("converged", study.reference_steps)):
        with torch.no_grad():
            sol = problem.solve(FixedPointIteration(max_steps=steps), Implicit())
        report = estimate_conditioning(problem.f, sol.value, *problem.args)
        rows.append({"point": label, "steps": steps, **report.as_dict()})
    return rows
