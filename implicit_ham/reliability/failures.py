"""Failure policy of implicit layers in training: what counts as a failure, and the monitor
that counts, logs and (rate-limited) warns about every one.

Failure kinds (``FAILURE_KINDS``; ``FAILURE_MEANINGS`` says what each means, for reports):
forward solves that missed their tolerance or went non-finite, at-fixed-point backward passes
(Implicit, Neumann) taken at a point that is not a fixed point (the residual recorded is
``||f(z*) - z*|| / ||f(z*)||``), backward solves that missed their tolerance or went non-finite,
and a non-finite loss, parameter gradient, input batch (checked before the forward pass, so no
model sees it) or buffer (e.g. a BatchNorm running variance), and a finite loss that diverges
(``loss_diverged``, when ``GuardedStep`` is given a ``LossDivergence``).

Policies (``on_failure``): ``"warn"`` (count, warn, keep the solver's result; non-finite values
raise), ``"raise"`` (raise at the first failure), ``"skip_batch"`` (drop the batch: no optimiser
step), ``"fallback"`` (the batch gets the one-step gradient; a non-finite forward, loss or
gradient, input or buffer cannot be fallen back and skips the batch). What each recorded action
means: ``ACTION_MEANINGS``.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from torch import nn

from implicit_ham._core.sinks import Sink
from implicit_ham._core.validation import check_choice, check_positive_int
from implicit_ham.adjoints.modes import Adjoint, AtFixedPoint

logger = logging.getLogger(__name__)

FAILURE_POLICIES = ("warn", "raise", "skip_batch", "fallback")
FAILURE_MEANINGS = {
    "forward_not_converged": "a forward solve with a tolerance stopped above it",
    "forward_nonfinite": "NaN / inf in a forward solve",
    "backward_not_fixed_point": (
        "an at-fixed-point backward mode (Implicit, Neumann) was asked to differentiate at a "
        "point whose relative residual exceeds its fixed_point_tol (e.g. a Hamburger's "
        "truncated K-step solve): the implicit function theorem's gradient does not hold there"
    ),
    "backward_not_converged": (
        "an implicit backward solve missed its tolerance at a fixed point (at a point that is "
        "not one, the pass counts as backward_not_fixed_point only)"
    ),
    "backward_nonfinite": "a backward solve produced NaN / inf",
    "loss_nonfinite": "the loss is NaN / inf",
    "loss_diverged": (
        "the training loss stayed above a factor times its lowest smoothed value for a number "
        "of steps in a row (finite divergence, e.g. a learning rate far too large; "
        "implicit_ham.reliability.divergence)"
    ),
    "grad_nonfinite": "a parameter gradient is NaN / inf",
    "input_nonfinite": "the batch's floating-point inputs hold NaN / inf",
    "buffer_nonfinite": "a buffer (e.g. a BatchNorm running variance) became NaN / inf",
}
FAILURE_KINDS = tuple(FAILURE_MEANINGS)
ACTION_MEANINGS = {
    "continued": "the layer's result was kept and training went on (policy warn)",
    "raised": "the run stopped with the error (policy raise)",
    "skipped": "the batch was dropped: no optimiser step (policy skip_batch, or fallback for a "
    "non-finite value)",
    "fallback": "the batch got the one-step gradient instead (policy fallback)",
}
ACTIONS = tuple(ACTION_MEANINGS)


def check_policy(policy: str) -> str:
    """``policy`` if it is one of ``FAILURE_POLICIES``; ValueError listing them otherwise."""
    check_choice("reliability", "on_failure", policy, FAILURE_POLICIES)
    return policy


@dataclass(frozen=True)
class FailureEvent:
    """One failure: its kind, the layer (module name; ``(loss)``/``(parameters)`` for the loss
    and gradients), the global step, the residual when there is one, and what was done."""

    kind: str
    layer: str
    step: int
    residual: float | None
    action: str

    def row(self) -> dict[str, Any]:
        """The event as a flat table row."""
        return dataclasses.asdict(self)


def apply_policy(layers: Mapping[str, nn.Module], policy: str) -> None:
    """Prepare the at-fixed-point adjoints (``Implicit``, ``Neumann``) among ``layers``.

    Under "warn" they keep their configured ``on_divergence``. Under every other policy they get
    ``on_divergence="fallback"``: a failed backward solve, or a point that is not a fixed point,
    then gives the one-step gradient (flagged in its statistics) instead of raising inside
    autograd, and the training step decides after the backward pass what to do, identically on
    every rank.
    """
    if check_policy(policy) == "warn":
        return
    for layer in layers.values():
        adjoint = adjoint_of(layer)
        if isinstance(adjoint, AtFixedPoint) and adjoint.on_divergence != "fallback":
            fallback = dataclasses.replace(adjoint, on_divergence="fallback")  # type: ignore[type-var]
            layer.adjoint = fallback  # type: ignore[assignment]


def adjoint_of(layer: nn.Module) -> Adjoint | None:
    """The layer's backward mode as an ``Adjoint`` (None when it is a string name)."""
    adjoint = getattr(layer, "adjoint", None)
    return adjoint if isinstance(adjoint, Adjoint) else None


class FailureMonitor:
    """Counts failure events by kind and layer, logs each to the sinks (table ``failures``)
    and warns through ``logging``, rate-limited per kind: the first ``warn_first`` events, then
    every ``warn_every``-th.

    Args:
        sinks: where event rows go (sinks without ``log_table`` get a metrics row instead).
        warn_first, warn_every: the rate limit of warnings.
    """

    def __init__(
        self, sinks: Sequence[Sink] = (), *, warn_first: int = 3, warn_every: int = 100
    ) -> None:
        check_positive_int("FailureMonitor", "warn_every", warn_every)
        if warn_first < 0:
            raise ValueError(f"FailureMonitor: warn_first={warn_first} must be >= 0")
        self.sinks = list(sinks)
        self.warn_first, self.warn_every = warn_first, warn_every
        self.counts: Counter[tuple[str, str, str]] = Counter()

    def record(self, event: FailureEvent) -> None:
        """Count, log and maybe warn about ``event``."""
        check_choice("FailureEvent", "kind", event.kind, FAILURE_KINDS)
        check_choice("FailureEvent", "action", event.action, ACTIONS)
        self.counts[(event.kind, event.layer, event.action)] += 1
        for sink in self.sinks:
            if hasattr(sink, "log_table"):
                sink.log_table("failures", [event.row()], step=event.step)
            else:
                sink.log({f"failure/{event.kind}/{event.layer}": event.residual}, event.step)
        seen = self.by_kind()[event.kind]
        if seen <= self.warn_first or seen % self.warn_every == 0:
            residual = "n/a" if event.residual is None else f"{event.residual:.3e}"
            logger.warning(
                "failure #%d of kind %s: layer %s, step %d, residual %s -> %s "
                "(warnings: first %d, then every %dth; all are counted in results.json)",
                seen,
                event.kind,
                event.layer,
                event.step,
                residual,
                event.action,
                self.warn_first,
                self.warn_every,
            )

    def by_kind(self) -> Counter[str]:
        """Events per kind."""
        out: Counter[str] = Counter()
        for (kind, _, _), n in self.counts.items():
            out[kind] += n
        return out

    def summary(self) -> dict[str, Any]:
        """``{"total", "by_kind", "by_action", "by_layer": {layer: {kind: n}}}``."""
        by_action: Counter[str] = Counter()
        by_layer: dict[str, Counter[str]] = {}
        for (kind, layer, action), n in self.counts.items():
            by_action[action] += n
            by_layer.setdefault(layer, Counter())[kind] += n
        return {
            "total": sum(self.counts.values()),
            "by_kind": dict(self.by_kind()),
            "by_action": dict(by_action),
            "by_layer": {k: dict(v) for k, v in sorted(by_layer.items())},
        }

    def state_dict(self) -> dict[str, Any]:
        """The counts as ``[[kind, layer, action, n], ...]`` (checkpoint-safe)."""
        return {"counts": [[k, layer, a, n] for (k, layer, a), n in sorted(self.counts.items())]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore counts saved by ``state_dict``."""
        self.counts = Counter({(k, layer, a): int(n) for k, layer, a, n in state["counts"]})

    def merge(self, states: Sequence[Mapping[str, Any]]) -> None:
        """Add the counts of other monitors (e.g. the other ranks') to this one."""
        for state in states:
            for kind, layer, action, n in state["counts"]:
                self.counts[(kind, layer, action)] += int(n)
