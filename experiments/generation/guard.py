"""One guarded GAN update (a discriminator or a generator step) under the failure policy of
``implicit_ham.reliability.failures``.

What counts as a failure (the library's kinds): ``forward_nonfinite`` (an implicit layer raised
``ih.NonFiniteError`` in the forward pass, e.g. a NaN feature map reaching a Hamburger),
``loss_nonfinite``, ``backward_nonfinite`` (``ih.NonFiniteError`` raised by a layer's gradient
guard in the backward pass) and ``grad_nonfinite`` (a NaN / inf parameter gradient). Each is
recorded in the ``FailureMonitor`` (counted, logged to the sinks' ``failures`` table, warned
about with a rate limit), then:

* ``raise`` and ``warn``: raise ``GanDivergedError`` (the library's "warn" continues only past
  finite events; a non-finite value raises under it too);
* ``skip_batch`` and ``fallback``: the update is dropped (no optimiser step; the networks'
  buffers, BatchNorm statistics and spectral-norm vectors, are restored), so a NaN never
  reaches the weights. After ``max_consecutive`` dropped updates in a row the run is declared
  diverged (``GanDivergedError``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from implicit_ham.errors import NonFiniteError
from implicit_ham.plugins import check_positive_int
from implicit_ham.reliability.failures import FailureEvent, FailureMonitor, check_policy

SKIPPING = ("skip_batch", "fallback")


class GanDivergedError(FloatingPointError):
    """A GAN update produced a non-finite value that the policy does not skip, or too many
    updates in a row were skipped."""


def network_of(layer: str) -> str:
    """The network ("D" or "G") of a failure event's ``layer`` ("D", "(D loss)",
    "(G parameters)", ...)."""
    return layer.strip("(").split()[0]


class GuardedUpdate:
    """Runs ``loss_fn() -> loss``, backward and ``optimizer.step()`` for one network.

    Args:
        name: "D" or "G" (the failure events' layer is ``(D loss)``, ``(G parameters)``, ...).
        optimizer: the network's optimiser. params: its parameters (checked after backward).
        buffers_of: the modules whose buffers a dropped update restores.
        policy: one of ``FAILURE_POLICIES``. monitor: receives every event.
        max_consecutive: dropped updates in a row after which the run counts as diverged.
    """

    def __init__(
        self,
        name: str,
        optimizer: torch.optim.Optimizer,
        params: Sequence[nn.Parameter],
        buffers_of: Sequence[nn.Module],
        *,
        policy: str,
        monitor: FailureMonitor,
        max_consecutive: int = 50,
    ) -> None:
        check_policy(policy)
        check_positive_int("GuardedUpdate", "max_consecutive", max_consecutive)
        self.name, self.optimizer, self.params = name, optimizer, list(params)
        self.buffers = [b for m in buffers_of for b in m.buffers()]
        self.policy, self.monitor, self.max_consecutive = policy, monitor, max_consecutive
        self.consecutive = 0
        self.skipped = 0

    def __call__(self, loss_fn: Callable[[], Tensor], step: int) -> float | None:
        """One update; returns the loss, or None when the update was dropped."""
        snapshot = [b.detach().clone() for b in self.buffers] if self.policy in SKIPPING else None
        self.optimizer.zero_grad(set_to_none=True)
        try:
            loss = loss_fn()
        except NonFiniteError as err:
            self._fail("forward_nonfinite", self.name, step, snapshot, err)
            return None
        if not bool(torch.isfinite(loss.detach())):
            self._fail("loss_nonfinite", f"({self.name} loss)", step, snapshot, None)
            return None
        try:
            loss.backward()
        except NonFiniteError as err:
            self._fail("backward_nonfinite", self.name, step, snapshot, err)
            return None
        grads = [p.grad for p in self.params if p.grad is not None]
        if grads and not bool(torch.isfinite(torch.stack([g.detach().sum() for g in grads])).all()):
            self._fail("grad_nonfinite", f"({self.name} parameters)", step, snapshot, None)
            return None
        self.optimizer.step()
        self.consecutive = 0
        return float(loss.detach())

    def _fail(
        self,
        kind: str,
        layer: str,
        step: int,
        snapshot: list[Tensor] | None,
        error: Exception | None,
    ) -> None:
        action = "raised" if snapshot is None else "skipped"
        self.monitor.record(FailureEvent(kind, layer, step, None, action))
        self.optimizer.zero_grad(set_to_none=True)
        detail = f": {error}" if error is not None else ""
        if snapshot is None:
            raise GanDivergedError(
                f"{self.name} update at step {step}: {kind}{detail} (reliability.on_failure="
                f"{self.policy!r}; skip_batch drops such updates instead)"
            )
        with torch.no_grad():
            for buffer, saved in zip(self.buffers, snapshot, strict=True):
                buffer.copy_(saved)
        self.consecutive += 1
        self.skipped += 1
        if self.consecutive >= self.max_consecutive:
            raise GanDivergedError(
                f"{self.name}: {self.consecutive} updates in a row were non-finite (last: {kind} "
                f"at step {step}{detail}); the GAN diverged. Lower the learning rates."
            )
