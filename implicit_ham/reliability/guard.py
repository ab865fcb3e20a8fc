"""``GuardedStep``: one optimisation step (forward, backward, update) under a failure policy.

What it checks, in order (see ``failures`` for the kinds and policies):

0. inputs: NaN/inf in floating-point inputs (``input_nonfinite``, before any forward);
1. forward: ``ih.NonFiniteError`` from a layer (attributed to the innermost implicit layer
   running, tracked by forward hooks), a non-finite buffer after the forward pass
   (``buffer_nonfinite``, e.g. a BatchNorm running variance), a non-finite loss, and every
   implicit layer whose
   ``last_solution.stats.converged`` is False, and (with a ``LossDivergence``) a finite loss
   that diverges;
2. backward: every implicit layer's ``last_solution.backward_log`` entry that did not converge
   or fell back, an error raised inside the backward pass, and non-finite parameter gradients.

Under ``skip_batch``/``fallback`` the model's buffers (BatchNorm statistics, online bases) are
restored when a batch is dropped, so a skipped batch leaves no trace. Under ``fallback`` a
forward that missed its tolerance in a layer differentiated at the fixed point (``Implicit``,
``Neumann``) is recomputed from the same RNG state and buffers with that layer's adjoint set to
``OneStep``; layers differentiated through their iterations keep their (exact) gradient of the
computed iterate. Under data parallelism both decisions are agreed on by all ranks (maximum of
the ranks' codes), so the ranks stay in step; an error inside a forward or backward pass then
raises on every policy (the other ranks are inside collectives that cannot be abandoned).

The solvers' own ``ConvergenceWarning`` s for events recorded here are replaced by the
monitor's rate-limited warnings; every other warning that passes the active filters is
re-emitted (once per message and location).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from implicit_ham._core.errors import (
    BackwardSolveError,
    ConvergenceWarning,
    ForwardSolveError,
    NonFiniteError,
)
from implicit_ham.adjoints.layers import find_implicit_layers
from implicit_ham.adjoints.modes import AtFixedPoint, OneStep
from implicit_ham.reliability.divergence import LossDivergedError, LossDivergence
from implicit_ham.reliability.failures import FailureEvent, FailureMonitor, adjoint_of, apply_policy
from implicit_ham.reliability.rng import capture_rng_state, restore_rng_state

OK, RECOMPUTE, SKIP = 0, 1, 2


class LossTask(Protocol):
    """What ``GuardedStep`` asks of a task: ``loss(logits, target) -> 0-d loss``."""

    def loss(self, logits: Tensor, target: Tensor) -> Tensor: ...


class RankAgreement(Protocol):
    """How ranks agree on a step's outcome under data parallelism: ``enabled`` (more than one
    rank) and ``max_code(code)`` (the maximum over ranks). The experiments' distributed context
    satisfies it; a single process needs nothing (``SingleProcess``)."""

    @property
    def enabled(self) -> bool: ...

    def max_code(self, code: int) -> int: ...


class SingleProcess:
    """``RankAgreement`` of one process: nothing to agree on."""

    enabled = False

    def max_code(self, code: int) -> int:
        """The code itself."""
        return code


@dataclass
class StepHooks:
    """Optional callbacks around each optimisation step (e.g. the diagnostics callback).

    ``after_backward(step)`` runs when gradients exist, ``after_step(step)`` after the update.
    """

    after_backward: Callable[[int], None] | None = None
    after_step: Callable[[int], None] | None = None


def unwrap(model: nn.Module) -> nn.Module:
    """The module inside a ``DistributedDataParallel`` wrapper (else ``model`` itself)."""
    return model.module if isinstance(model, DistributedDataParallel) else model


class GuardedStep:
    """Runs training steps of ``model`` under ``policy``; call it per batch.

    Args:
        model: the model (possibly wrapped in DistributedDataParallel).
        task: gives the loss (anything with ``loss(logits, target)``).
        optimizer: stepped unless the batch is skipped.
        policy: one of ``FAILURE_POLICIES``; sets ``on_divergence`` of the Implicit adjoints.
        monitor: receives every event (default: a new ``FailureMonitor`` without sinks).
        hooks: ``after_backward(step)`` runs after every backward pass, ``after_step(step)``
            after every optimiser update.
        dist: how ranks agree on a batch's outcome (default: a single process).
        divergence: checks every finite loss for divergence (``LossDivergence``); a flagged
            step is a ``loss_diverged`` event: "continued" under warn, "raised"
            (``LossDivergedError``) under raise, the batch "skipped" under skip_batch and
            fallback (nothing to fall back to). None (default): no check.

    An empty batch (0 samples) raises ValueError naming the step: its loss would be NaN and
    be counted as a non-finite loss.
    """

    def __init__(
        self,
        model: nn.Module,
        task: LossTask,
        optimizer: torch.optim.Optimizer,
        *,
        policy: str = "warn",
        monitor: FailureMonitor | None = None,
        hooks: StepHooks | None = None,
        dist: RankAgreement | None = None,
        divergence: LossDivergence | None = None,
    ) -> None:
        self.model, self.task, self.optimizer, self.policy = model, task, optimizer, policy
        self.divergence = divergence
        self.monitor = monitor or FailureMonitor()
        self.hooks = hooks
        self.dist: RankAgreement = dist or SingleProcess()
        self.layers = find_implicit_layers(unwrap(model))
        apply_policy(self.layers, policy)
        self._active: list[str] = []
        self._registry: dict[Any, Any] = {}
        self._handles = [h for name, layer in self.layers.items() for h in self._track(name, layer)]

    def __call__(self, inputs: Tensor, target: Tensor, step: int) -> Tensor | None:
        """Forward, backward and (unless skipped) ``optimizer.step()`` on one batch.

        Returns:
            The batch's loss (0-d, detached), or None when the batch was skipped.
        """
        snapshot = self._snapshot() if self.policy in ("skip_batch", "fallback") else None
        self.optimizer.zero_grad(set_to_none=True)
        loss, code = self._forward(inputs, target, step)
        code = self.dist.max_code(code)
        if code == SKIP or loss is None:
            self._skip(snapshot)
            return None
        if code == RECOMPUTE:
            loss = self._recompute(inputs, target, snapshot)
        code = self.dist.max_code(self._backward(loss, step))
        if code == SKIP:
            self._skip(snapshot)
            return None
        self.optimizer.step()
        if self.hooks is not None and self.hooks.after_step is not None:
            self.hooks.after_step(step)
        return loss.detach()

    def close(self) -> None:
        """Remove the forward hooks this object placed on the implicit layers."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    # ------------------------------------------------------------------------ forward
    def _forward(self, inputs: Tensor, target: Tensor, step: int) -> tuple[Tensor | None, int]:
        loss, error = None, None
        if inputs.ndim and not len(inputs):
            raise ValueError(
                f"step {step}: an empty batch (inputs of shape {tuple(inputs.shape)}): it has no "
                "loss. Check the data loader (a sampler or collate function that yields empty "
                "batches, a dataset smaller than one batch)."
            )
        if inputs.is_floating_point() and not bool(torch.isfinite(inputs).all()):
            self._fail("input_nonfinite", "(inputs)", step, None, None)
            return None, SKIP
        self._active.clear()
        with warnings.catch_warnings(record=True) as caught:
            try:
                loss = self.task.loss(self.model(inputs), target)
            except NonFiniteError as err:
                error = err
        if error is not None or loss is None:
            layer = self._active[-1] if self._active else "(model)"
            self._active.clear()
            self._reemit(caught, recorded=True)
            self._fail("forward_nonfinite", layer, step, None, error)
            return None, SKIP
        buffer = self._nonfinite_buffer()
        if buffer is not None:
            self._reemit(caught, recorded=False)
            self._fail("buffer_nonfinite", buffer, step, None, None)
            return None, SKIP
        events = self._forward_misses(step)
        finite = bool(torch.isfinite(loss.detach()))
        self._reemit(caught, recorded=bool(events))
        code = max((c for _, c in events), default=OK)
        for event, _ in events:
            self.monitor.record(event)
        if self.policy == "raise" and events:
            first = events[0][0]
            raise ForwardSolveError(
                f"step {step}: forward solve of layer {first.layer} stopped at relative "
                f"residual {first.residual:.3e}, above its tolerance (on_failure=raise). Raise "
                "the solver's max_steps / steps, loosen tol, or choose on_failure=fallback."
            )
        if not finite:
            self._fail("loss_nonfinite", "(loss)", step, None, None)
            code = SKIP
        elif self.divergence is not None:
            code = max(code, self._check_divergence(self.divergence, float(loss.detach()), step))
        return loss, code

    def _check_divergence(self, check: LossDivergence, loss: float, step: int) -> int:
        """Record a ``loss_diverged`` event when ``check`` flags this step's loss."""
        bar = check.threshold
        if not check.update(loss) or bar is None:
            return OK
        action = {"warn": "continued", "raise": "raised"}.get(self.policy, "skipped")
        self.monitor.record(FailureEvent("loss_diverged", "(loss)", step, loss / bar, action))
        if self.policy == "raise":
            raise LossDivergedError(
                f"step {step}: the training loss {loss:.4g} has stayed above {check.factor:g} x "
                f"its lowest smoothed value ({bar / check.factor:.4g}) for {check.above} steps: "
                "the run diverges (on_failure=raise). Lower the learning rate, or loosen the "
                "check (reliability.divergence_factor / divergence_steps; 0 steps: off)."
            )
        return SKIP if action == "skipped" else OK

    def _forward_misses(self, step: int) -> list[tuple[FailureEvent, int]]:
        out = []
        for name, layer in self.layers.items():
            solution = getattr(layer, "last_solution", None)
            converged = None if solution is None else solution.stats.converged
            if solution is None or converged is None or bool(converged.all()):
                continue
            residual = float(solution.stats.rel_residual.max())
            action, code = self._miss_action(layer)
            out.append((FailureEvent("forward_not_converged", name, step, residual, action), code))
        return out

    def _miss_action(self, layer: nn.Module) -> tuple[str, int]:
        if self.policy == "raise":
            return "raised", OK
        if self.policy == "skip_batch":
            return "skipped", SKIP
        if self.policy == "fallback" and isinstance(adjoint_of(layer), AtFixedPoint):
            return "fallback", RECOMPUTE
        return "continued", OK

    def _recompute(self, inputs: Tensor, target: Tensor, snapshot: dict[str, Any] | None) -> Tensor:
        """The batch again from the same RNG state and buffers, with the at-fixed-point layers'
        adjoints set to OneStep."""
        self._restore(snapshot, rng=True)
        saved: dict[str, Any] = {}
        for name, layer in self.layers.items():
            if isinstance(adjoint_of(layer), AtFixedPoint):
                saved[name] = layer.adjoint
                layer.adjoint = OneStep()  # type: ignore[assignment]
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ConvergenceWarning)
                return self.task.loss(self.model(inputs), target)
        finally:
            for name, adjoint in saved.items():
                self.layers[name].adjoint = adjoint

    # ----------------------------------------------------------------------- backward
    def _backward(self, loss: Tensor, step: int) -> int:
        error = None
        with warnings.catch_warnings(record=True) as caught:
            try:
                loss.backward()
            except (NonFiniteError, BackwardSolveError) as err:
                error = err
        if self.hooks is not None and self.hooks.after_backward is not None:
            self.hooks.after_backward(step)
        if error is not None:
            kind = (
                "backward_nonfinite"
                if isinstance(error, NonFiniteError)
                else ("backward_not_converged")
            )
            self._reemit(caught, recorded=True)
            self._fail(kind, self._backward_layer(), step, None, error)
            return SKIP
        events = self._backward_failures(step)
        self._reemit(caught, recorded=bool(events))
        for event in events:
            self.monitor.record(event)
        if self.policy == "raise" and events:
            first = events[0]
            error_type = (
                NonFiniteError if first.kind == "backward_nonfinite" else (BackwardSolveError)
            )
            raise error_type(
                f"step {step}: implicit backward of layer {first.layer} failed ({first.kind}, "
                f"relative residual {first.residual:.3e}; on_failure=raise). Raise the adjoint's "
                "max_steps, use another linear solver or backward mode, or on_failure=fallback."
            )
        code = SKIP if self.policy == "skip_batch" and events else OK
        if not self._gradients_finite():
            self._fail("grad_nonfinite", "(parameters)", step, None, None)
            code = SKIP
        return code

    def _backward_failures(self, step: int) -> list[FailureEvent]:
        out = []
        for name, layer in self.layers.items():
            solution = getattr(layer, "last_solution", None)
            for stats in [] if solution is None else solution.backward_log:
                if stats.converged is not False and not stats.fallback and stats.at_fixed_point:
                    continue
                if stats.at_fixed_point is False:
                    kind, residual = "backward_not_fixed_point", stats.forward_residual
                elif math.isfinite(stats.abs_residual):
                    kind, residual = "backward_not_converged", stats.rel_residual
                else:
                    kind, residual = "backward_nonfinite", stats.rel_residual
                action = {"raise": "raised", "skip_batch": "skipped"}.get(
                    self.policy, "fallback" if stats.fallback else "continued"
                )
                out.append(FailureEvent(kind, name, step, residual, action))
        return out

    def _backward_layer(self) -> str:
        candidates = [n for n, m in self.layers.items() if isinstance(adjoint_of(m), AtFixedPoint)]
        return candidates[0] if len(candidates) == 1 else "(backward)"

    def _nonfinite_buffer(self) -> str | None:
        """The name of the first floating-point buffer holding NaN/inf, else None."""
        for name, buffer in unwrap(self.model).named_buffers():
            if buffer.is_floating_point() and not bool(torch.isfinite(buffer).all()):
                return name
        return None

    def _gradients_finite(self) -> bool:
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        if not grads:
            return True
        return bool(torch.isfinite(torch.nn.utils.get_total_norm(grads)))

    # ------------------------------------------------------------------------ helpers
    def _fail(
        self, kind: str, layer: str, step: int, residual: float | None, error: Exception | None
    ) -> None:
        """Record a failure that cannot be fallen back: raise under warn/raise (and, for an
        error inside a pass, under data parallelism), else the batch is skipped."""
        fatal = self.policy in ("warn", "raise") or (error is not None and self.dist.enabled)
        self.monitor.record(
            FailureEvent(kind, layer, step, residual, "raised" if fatal else "skipped")
        )
        if not fatal:
            return
        if error is not None:
            raise error
        raise NonFiniteError(
            f"step {step}: {kind.replace('_', ' ')} ({layer}) under on_failure={self.policy}. "
            "Lower the learning rate, check the data, or choose on_failure=skip_batch."
        )

    def _skip(self, snapshot: dict[str, Any] | None) -> None:
        self._restore(snapshot, rng=False)
        self.optimizer.zero_grad(set_to_none=True)
        return None

    def _snapshot(self) -> dict[str, Any]:
        buffers = {k: b.detach().clone() for k, b in unwrap(self.model).named_buffers()}
        rng = capture_rng_state() if self.policy == "fallback" else None
        return {"buffers": buffers, "rng": rng}

    def _restore(self, snapshot: dict[str, Any] | None, *, rng: bool) -> None:
        if snapshot is None:
            return
        with torch.no_grad():
            for name, buffer in unwrap(self.model).named_buffers():
                buffer.copy_(snapshot["buffers"][name])
        if rng and snapshot["rng"] is not None:
            restore_rng_state(snapshot["rng"])

    def _track(self, name: str, layer: nn.Module) -> list[Any]:
        def enter(*_: Any) -> None:
            self._active.append(name)

        def leave(*_: Any) -> None:
            if self._active and self._active[-1] == name:
                self._active.pop()

        return [layer.register_forward_pre_hook(enter), layer.register_forward_hook(leave)]

    def _reemit(self, caught: list[warnings.WarningMessage], *, recorded: bool) -> None:
        for item in caught:
            if recorded and issubclass(item.category, ConvergenceWarning):
                continue
            warnings.warn_explicit(
                item.message, item.category, item.filename, item.lineno, registry=self._registry
            )
