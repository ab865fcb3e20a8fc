"""Gradient-norm clipping as a step hook (``clip_grad_norm`` of the training config).

After each backward pass (before the update) the gradients of every parameter are rescaled by
``torch.nn.utils.clip_grad_norm_`` so that their joint 2-norm is at most ``max_norm``. The
same clip for every arm of a comparison keeps an unstable backward mode (BPTT through a sharp
softmax) from being judged by its rare exploding steps alone.
"""

from __future__ import annotations

import torch
from torch import nn

from implicit_ham.reliability.guard import StepHooks


def clip_grad_hooks(hooks: StepHooks, model: nn.Module, max_norm: float) -> StepHooks:
    """``hooks`` with the clip added after their ``after_backward``.

    Args:
        hooks: existing hooks (kept; the clip runs after their ``after_backward``).
        model: whose parameters' gradients are clipped (those without a gradient are skipped).
        max_norm: the largest joint 2-norm of the gradients; must be > 0.
    """
    if not max_norm > 0:
        raise ValueError(f"clip_grad_norm must be > 0 (or null: no clipping), got {max_norm!r}")
    parameters = [p for p in model.parameters() if p.requires_grad]
    before = hooks.after_backward

    def after_backward(step: int) -> None:
        if before is not None:
            before(step)
        torch.nn.utils.clip_grad_norm_(parameters, max_norm)

    return StepHooks(after_backward=after_backward, after_step=hooks.after_step)
