"""``DiagnosticsCallback``: log gradient norms, solver statistics and conditioning from a
training loop every N steps, to any ``Sink``.

Usage::

    cb = DiagnosticsCallback(model, sinks, every=50, optimizer=opt, conditioning_every=500)
    for step, batch in enumerate(loader):
        loss = criterion(model(batch))
        loss.backward()
        cb.on_backward(step)                 # before optimizer.step() / zero_grad()
        opt.step(); opt.zero_grad()
        cb.on_step(step, {"loss": loss})     # optional: extra metrics, logged on the same steps

Steps that log nothing cost one modulo test: the backward hooks of the implicit layers are
attached only for the forward/backward of a logged step (armed at the end of the previous
``on_backward``, or at construction for the first step), and removed right after.

Implicit layers are the submodules with an ``adjoint`` attribute (``ImplicitLayer`` lists what
the callback reads). From those that also have
``last_solution`` (a ``Solution``) the forward statistics are logged; from those that also have
``implicit_problem(*inputs) -> FixedPointProblem`` the conditioning of ``I - J`` at
``last_solution.value`` is estimated on ``conditioning_every`` steps (the inputs of the layer's
last call on such a step are captured by a forward pre-hook; the problem is built under a forked
RNG so that training randomness is unchanged).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from implicit_ham._core.sinks import MultiSink, Sink
from implicit_ham._core.validation import check_positive_int
from implicit_ham.adjoints.layers import find_implicit_layers
from implicit_ham.diagnostics.conditioning import estimate_conditioning, warn_if_ill_conditioned
from implicit_ham.diagnostics.gradient_norms import LayerGradientHooks, grad_norms
from implicit_ham.diagnostics.measure import fork_rng_on

logger = logging.getLogger(__name__)


class DiagnosticsCallback:
    """Logs diagnostics of ``model`` every ``every`` steps (see the module docstring).

    Args:
        model: the model being trained.
        sinks: a ``Sink`` or a sequence of them.
        every: log gradient norms, layer gradient norms and solver statistics every N steps.
        optimizer: when given, gradient norms per parameter group are logged too.
        depth: module depth of the per-module gradient norms (see ``grad_norms``).
        layers: implicit layers to watch (name -> module); default ``find_implicit_layers``.
        layer_hooks: record the gradient norms at the layers' inputs and outputs.
        conditioning_every: estimate conditioning every N steps (None: never). It costs about
            a hundred evaluations of each layer's map; choose a multiple of ``every``.
        conditioning_kwargs: forwarded to ``estimate_conditioning``.
        conditioning_threshold: when set, warn ``ConditioningWarning`` above this κ.
    """

    def __init__(
        self,
        model: nn.Module,
        sinks: Sink | Sequence[Sink],
        every: int = 50,
        *,
        optimizer: torch.optim.Optimizer | None = None,
        depth: int = 1,
        layers: Mapping[str, nn.Module] | None = None,
        layer_hooks: bool = True,
        conditioning_every: int | None = None,
        conditioning_kwargs: Mapping[str, Any] | None = None,
        conditioning_threshold: float | None = None,
    ) -> None:
        check_positive_int("DiagnosticsCallback", "every", every)
        if conditioning_every is not None:
            check_positive_int("DiagnosticsCallback", "conditioning_every", conditioning_every)
        self.model = model
        self.sink = sinks if isinstance(sinks, Sink) else MultiSink(sinks)
        self.every = every
        self.optimizer = optimizer
        self.depth = depth
        self.layers = dict(find_implicit_layers(model) if layers is None else layers)
        self.hooks = LayerGradientHooks(self.layers) if layer_hooks else None
        self.conditioning_every = conditioning_every
        self.conditioning_kwargs = dict(conditioning_kwargs or {})
        self.conditioning_threshold = conditioning_threshold
        self._capture_handles: list[RemovableHandle] = []
        self._captured: dict[str, tuple[tuple[Any, ...], dict[str, Any]]] = {}
        self.prepare(0)

    def due(self, step: int) -> bool:
        """Whether ``step`` logs gradient norms and solver statistics."""
        return step % self.every == 0

    def conditioning_due(self, step: int) -> bool:
        """Whether ``step`` estimates conditioning."""
        return self.conditioning_every is not None and step % self.conditioning_every == 0

    def prepare(self, step: int) -> None:
        """Arm the hooks needed by ``step`` before its forward pass (done automatically for
        consecutive steps; call it yourself when steps are skipped)."""
        if self.hooks is not None and self.due(step):
            self.hooks.attach()
        if self.conditioning_due(step) and not self._capture_handles:
            for name, layer in self.layers.items():
                if hasattr(layer, "implicit_problem"):
                    self._capture_handles.append(
                        layer.register_forward_pre_hook(self._capture_for(name), with_kwargs=True)
                    )

    def _capture_for(self, name: str) -> Any:
        def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            detached = tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in args)
            self._captured[name] = (detached, dict(kwargs))

        return hook

    def _release(self) -> None:
        if self.hooks is not None:
            self.hooks.detach()
        for handle in self._capture_handles:
            handle.remove()
        self._capture_handles.clear()
        self._captured.clear()

    def on_backward(self, step: int) -> None:
        """Call after ``loss.backward()`` and before ``optimizer.step()``: logs the step's
        diagnostics when due, then arms the hooks for ``step + 1``."""
        due, cond_due = self.due(step), self.conditioning_due(step)
        if due or cond_due:
            start = time.perf_counter()
            metrics: dict[str, Any] = {}
            if due:
                metrics.update(grad_norms(self.model, depth=self.depth, optimizer=self.optimizer))
                if self.hooks is not None:
                    metrics.update(self.hooks.pop())
                metrics.update(self._solver_metrics())
            if cond_due:
                metrics.update(self._conditioning_metrics())
            metrics["diagnostics/seconds"] = time.perf_counter() - start
            self.sink.log(metrics, step)
        self._release()
        self.prepare(step + 1)

    def on_step(self, step: int, metrics: Mapping[str, Any] | None = None) -> None:
        """Optional, after ``optimizer.step()``: log ``metrics`` (e.g. the loss) when due."""
        if metrics and self.due(step):
            self.sink.log(metrics, step)

    def _solver_metrics(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, layer in self.layers.items():
            sol = getattr(layer, "last_solution", None)
            if sol is None:
                continue
            summary = sol.stats.summary()
            for key in ("steps", "abs_residual", "rel_residual", "converged"):
                out[f"solver/{name}/{key}"] = summary[key]
            back = sol.backward_stats
            if back is not None:
                out[f"backward/{name}/steps"] = back.steps
                out[f"backward/{name}/rel_residual"] = back.rel_residual
                if back.cond is not None:
                    out[f"backward/{name}/cond"] = back.cond
                if back.cond_lower_bound is not None:
                    out[f"backward/{name}/cond_lower_bound"] = back.cond_lower_bound
        return out

    def _conditioning_metrics(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, (args, kwargs) in self._captured.items():
            layer: Any = self.layers[name]  # an implicit layer: has implicit_problem
            sol = getattr(layer, "last_solution", None)
            if sol is None:
                logger.warning("conditioning: layer %s has no last_solution; skipped", name)
                continue
            tensors = [a for a in args if isinstance(a, torch.Tensor)]
            device = tensors[0].device if tensors else torch.device("cpu")
            with fork_rng_on(device), torch.no_grad():
                problem = layer.implicit_problem(*args, **kwargs)
            report = estimate_conditioning(
                problem.f, sol.value, *problem.args, **self.conditioning_kwargs
            )
            out.update(report.as_dict(prefix=f"cond/{name}/"))
            if self.conditioning_threshold is not None:
                warn_if_ill_conditioned(report, self.conditioning_threshold, where=name)
        return out

    def close(self) -> None:
        """Remove every hook (the sinks stay open: close them yourself)."""
        self._release()
