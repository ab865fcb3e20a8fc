"""The Jacobian penalty as a training option of the engine (``penalty=jacobian``).

``JacobianPenalty(weight, every, samples)`` adds ``weight * sum_l ih.jacobian_penalty(f_l, z*_l,
*args_l)`` to the training loss of every ``every``-th step (steps 0, every, 2 every, ...), one
term per implicit layer l of the model, at the fixed point of its latest forward: the Hutchinson
estimate of ``||df/dz||_F^2 / numel(z)`` (TorchDEQ's ``jac_loss_weight`` / ``jac_loss_freq``).
A layer qualifies when it has ``implicit_problem(*inputs)`` and ``last_solution`` (the library's
decompositions, the diagnostics' layers): the penalty captures the layer's inputs during the
training forward (a forward pre-hook, with their graph) and rebuilds the layer's map from them,
so the penalty trains the layer's parameters and what produced its inputs. The rebuilt problem
draws its initial state (unused here) under ``torch.random.fork_rng``, so only the probe vectors
consume the global random stream. Cost per penalised step: one evaluation of f and one VJP per
sample and layer, and about one more VJP each in the backward pass.

The engine's ``Task`` adds ``term()`` to its loss when gradient is enabled (training, not
evaluation); ``Trainer.train_epoch`` sets ``step`` before each batch.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

import implicit_ham as ih
from implicit_ham.diagnostics import find_implicit_layers
from implicit_ham.plugins import check_positive_int

logger = logging.getLogger(__name__)


class JacobianPenalty:
    """``weight * ih.jacobian_penalty`` at each implicit layer's fixed point, every ``every``-th
    training step.

    Args:
        weight: the penalty's weight in the loss (>= 0; 0 adds nothing; default 1).
        every: apply it on steps ``0, every, 2 * every, ...`` (>= 1; 1: every step).
        samples: Gaussian probe vectors per estimate (>= 1).

    Attributes:
        step: the training step the next loss belongs to (set by ``Trainer.train_epoch``).
        last: the latest penalty term added (``weight * sum``, detached), None before one.
    """

    def __init__(self, weight: float = 1.0, every: int = 1, samples: int = 1) -> None:
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight >= 0:
            raise ValueError(
                f"JacobianPenalty: weight must be a number >= 0, got {weight!r}; e.g. "
                "penalty.weight=0.1"
            )
        check_positive_int("JacobianPenalty", "every", every)
        check_positive_int("JacobianPenalty", "samples", samples)
        self.weight, self.every, self.samples = float(weight), every, samples
        self.step = 0
        self.last: Tensor | None = None
        self._layers: dict[str, nn.Module] = {}
        self._inputs: dict[str, tuple[tuple[Any, ...], dict[str, Any]]] = {}
        self._handles: list[RemovableHandle] = []

    def __repr__(self) -> str:
        return (
            f"JacobianPenalty(weight={self.weight:g}, every={self.every}, "
            f"samples={self.samples})"
        )

    def attach(self, model: nn.Module) -> JacobianPenalty:
        """Capture the inputs of ``model``'s implicit layers during training forwards.

        Raises:
            ValueError: the model has no implicit layer with ``implicit_problem`` and
                ``last_solution`` (no fixed point to penalise).
        """
        layers = {
            name: layer
            for name, layer in find_implicit_layers(model).items()
            if callable(getattr(layer, "implicit_problem", None))
            and hasattr(layer, "last_solution")
        }
        if not layers:
            raise ValueError(
                f"penalty=jacobian: {type(model).__name__} has no implicit layer with "
                "implicit_problem and last_solution (e.g. context=nmf or another "
                "decomposition), so there is no fixed point to penalise; drop the penalty"
            )
        self.close()
        self._layers = layers
        for name, layer in layers.items():
            self._handles.append(layer.register_forward_pre_hook(self._capture(name),
                                                                 with_kwargs=True))
        return self

    def _capture(self, name: str) -> Any:
        def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            if module.training and torch.is_grad_enabled():
                self._inputs[name] = (args, kwargs)

        return hook

    def due(self, step: int | None = None) -> bool:
        """Whether the penalty applies at ``step`` (default: ``self.step``)."""
        step = self.step if step is None else step
        return self.weight > 0 and step % self.every == 0

    def term(self) -> Tensor | None:
        """``weight * sum_l ih.jacobian_penalty(...)`` for the current step, or None when the
        step is not due (or no training forward was captured)."""
        if not self.due() or not self._inputs:
            return None
        total: Tensor | None = None
        for name, (args, kwargs) in self._inputs.items():
            layer: Any = self._layers[name]
            solution = layer.last_solution
            if solution is None:
                continue
            devices = [t.device for t in args if isinstance(t, Tensor) and t.is_cuda]
            with torch.random.fork_rng(devices=devices):
                problem = layer.implicit_problem(*args, **kwargs)
            value = ih.jacobian_penalty(
                problem.f, solution.value, *problem.args, samples=self.samples
            )
            total = value if total is None else total + value
        self._inputs.clear()
        if total is None:
            return None
        out = self.weight * total
        self.last = out.detach()
        return out

    def close(self) -> None:
        """Remove the hooks."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._inputs.clear()
