"""Gradients of the *task loss* with respect to a ham's input, under each backward mode.

The gradient study of ``experiments.studies.model_studies`` differentiates the layer's raw
fixed-point problem
(its "one_step" there goes through the last D update). This module measures what training
uses: the whole model's cross-entropy over the labelled pixels (``Task.loss``, whose
``ignore_index`` drops unlabelled pixels), differentiated with respect to the ham's input X
(the lower bread's output, through which the backbone and the lower bread are trained), with
the decomposition configured exactly as in the training arms:

* ``one_step (paper)``: ``OneStep`` with the bases detached (``grad_through_bases=False``),
  the gradient the paper's code and the ``*_one_step`` arms train with;
* ``one_step (through bases)``: ``OneStep`` with the last step's bases differentiated
  (``grad_through_bases=True``), the ``*_one_step_bases`` arms; the only difference to the
  paper's is ∂D/∂X, so this pair isolates it;
* ``unroll`` (BPTT at the same K), ``phantom(5,0.5)``, ``implicit(ridge=1)``.

Every mode sees the same initial bases (the RNG is re-seeded before each forward pass) and the
model in eval mode (BatchNorm with running statistics, ``eval_steps`` = K), so the forward
value is the same for all modes at one K. The reference gradient is BPTT through
``reference_steps`` iterations.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from experiments.engine.task import Task
from implicit_ham.adjoints.modes import Adjoint, Implicit, OneStep, Phantom, Unroll
from implicit_ham.decompositions.base import Decomposition
from implicit_ham.diagnostics.measure import fork_rng_on
from implicit_ham.errors import ConditioningWarning, ConvergenceWarning

PAPER_ONE_STEP = "one_step (paper: bases detached)"
THROUGH_BASES = "one_step (through the last step's bases)"
TASK_MODES: dict[str, Callable[[], tuple[Adjoint, bool]]] = {
    PAPER_ONE_STEP: lambda: (OneStep(), False),
    THROUGH_BASES: lambda: (OneStep(), True),
    "unroll": lambda: (Unroll(), False),
    "phantom(5,0.5)": lambda: (Phantom(5, 0.5), False),
    "implicit(ridge=1)": lambda: (Implicit(max_steps=30, ridge=1.0), False),
}


def task_loss_gradient(
    model: nn.Module,
    ham: Decomposition,
    inputs: Tensor,
    target: Tensor,
    task: Task,
    *,
    adjoint: Adjoint,
    through_bases: bool,
    steps: int,
) -> Tensor:
    """d(task loss)/dX at the ham's input X (same shape as X) for one backward mode.

    Args:
        model: the whole network (put in eval mode here), containing ``ham``.
        inputs: images (B, C, H, W). target: labels (B, H, W) (or (B,) for classification).
        adjoint, through_bases: the ham's backward mode and ``grad_through_bases``.
        steps: K, the ham's iterations (set as its ``steps`` and ``eval_steps``).
    """
    model.eval()
    saved = (ham.adjoint, ham.grad_through_bases, ham.steps, ham.eval_steps)
    ham.adjoint, ham.grad_through_bases, ham.steps, ham.eval_steps = (
        adjoint,
        through_bases,
        steps,
        steps,
    )
    leaves: list[Tensor] = []

    def swap_input(_module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        leaf = args[0].detach().requires_grad_()
        leaves.append(leaf)
        return (leaf, *args[1:])

    handle = ham.register_forward_pre_hook(swap_input)
    try:
        with fork_rng_on(inputs.device), warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)  # K steps are not a fixed point
            warnings.simplefilter("ignore", ConditioningWarning)
            torch.manual_seed(0)
            loss = task.loss(model(inputs), target)
            (grad,) = torch.autograd.grad(loss, leaves[0])
    finally:
        handle.remove()
        ham.adjoint, ham.grad_through_bases, ham.steps, ham.eval_steps = saved
    return grad


def task_gradient_rows(
    model: nn.Module,
    ham: Decomposition,
    inputs: Tensor,
    target: Tensor,
    task: Task,
    ks: list[int],
    reference_steps: int,
) -> list[dict[str, Any]]:
    """One row per (mode of ``TASK_MODES``, K): ``mode``, ``K``, ``grad_norm``,
    ``cosine_same_k`` (to BPTT at that K) and ``cosine`` (to BPTT through
    ``reference_steps``)."""

    def grad(mode: str, steps: int) -> Tensor:
        adjoint, through = TASK_MODES[mode]()
        return task_loss_gradient(
            model, ham, inputs, target, task, adjoint=adjoint, through_bases=through, steps=steps
        )

    reference = grad("unroll", reference_steps)
    rows = []
    for k in ks:
        bptt = grad("unroll", k)
        for mode in TASK_MODES:
            g = bptt if mode == "unroll" else grad(mode, k)
            rows.append(
                {
                    "mode": mode,
                    "K": k,
                    "grad_norm": float(g.norm()),
                    "cosine_same_k": _cosine(g, bptt),
                    "cosine": _cosine(g, reference),
                }
            )
    return rows


def _cosine(a: Tensor, b: Tensor) -> float | None:
    """Cosine of two gradients (None when either is zero)."""
    denominator = float(a.norm() * b.norm())
    return float((a * b).sum()) / denominator if denominator > 0 else None
