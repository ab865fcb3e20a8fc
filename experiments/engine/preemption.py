"""Graceful preemption: a signal asks the run to stop at the next step boundary.

A cluster scheduler announces a preemption (or the end of a time limit) with a signal: Slurm
sends SIGTERM (or the signal of ``--signal``, often SIGUSR1) and a shell's Ctrl-C sends SIGINT.
``PreemptionGuard`` replaces the handlers of the configured signals by one that only records the
signal; the training loop asks ``requested()`` after every step and, when it is set, writes a
checkpoint and raises ``PreemptedError``. The job then writes ``results.json`` with
``status: "preempted"`` and exits with status ``128 + signal number`` (the shell convention:
143 for SIGTERM, 138 for SIGUSR1, 130 for SIGINT), and the same command run again resumes from
that checkpoint bit-identically. A second signal while the first is being handled exits at
once (same status, no checkpoint), so a stuck run can still be stopped.

``preemptible`` is what a command's job runs under (``experiments.engine.run.run_training``):
the guard over the configured signals (plus
submitit's own under submitit) and, when ``PreemptedError`` leaves it, the requeue under
submitit; ``preempted_results`` is the ``results.json`` such a job writes before raising.
"""

from __future__ import annotations

import logging
import os
import signal
import types
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from experiments.engine.submitit_requeue import preemption_signals, requeue

logger = logging.getLogger(__name__)

Handler = Callable[[int, types.FrameType | None], Any] | int | None


class PreemptedError(Exception):
    """The run stopped at a step boundary on ``signum``, after writing a checkpoint of
    ``step``."""

    def __init__(self, signum: int, step: int) -> None:
        super().__init__(f"preempted by {signal.Signals(signum).name} after step {step}")
        self.signum, self.step = signum, step

    @property
    def exit_code(self) -> int:
        """``128 + signal number``: what ``experiments.train`` exits with."""
        return 128 + self.signum


def parse_signals(names: Sequence[str]) -> list[signal.Signals]:
    """Signals by name ("SIGTERM" or "TERM"); ValueError naming an unknown one."""
    out = []
    for name in names:
        full = name if name.upper().startswith("SIG") else f"SIG{name}"
        try:
            out.append(signal.Signals[full.upper()])
        except KeyError:
            raise ValueError(
                f"reliability.preempt_signals: unknown signal {name!r}; use names such as "
                "SIGUSR1, SIGTERM, SIGINT (or [] to keep the default handlers)"
            ) from None
        if out[-1] in (signal.SIGKILL, signal.SIGSTOP):
            raise ValueError(f"reliability.preempt_signals: {full} cannot be caught")
    return out


class PreemptionGuard:
    """Context manager: while active, the given signals set a flag instead of killing the process.

    The previous handlers are restored on exit. Signal handlers can only be installed from the
    main thread; elsewhere (e.g. a job run in a worker thread) the guard logs a warning and does
    nothing.
    """

    def __init__(self, signals: Sequence[signal.Signals]) -> None:
        self.signals = list(signals)
        self.signum: int | None = None
        self._previous: dict[signal.Signals, Handler] = {}

    def requested(self) -> bool:
        """Whether a preemption signal arrived."""
        return self.signum is not None

    def _handle(self, signum: int, frame: types.FrameType | None) -> None:
        if self.signum is not None:
            name = signal.Signals(signum).name
            logger.error("second %s: exiting now, without a checkpoint", name)
            os._exit(128 + signum)
        self.signum = signum
        logger.warning(
            "received %s: stopping after the current step (checkpoint, results.json "
            "status=preempted); send it again to exit at once",
            signal.Signals(signum).name,
        )

    def __enter__(self) -> PreemptionGuard:
        for sig in self.signals:
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread
                logger.warning("cannot handle %s outside the main thread; not installed", sig.name)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()


@contextmanager
def preemptible(signal_names: Sequence[str]) -> Iterator[PreemptionGuard]:
    """Run a job body under a ``PreemptionGuard`` of ``signal_names``
    (``reliability.preempt_signals``; under submitit its preemption signal is added). The body
    asks ``guard.signum`` at its step boundaries and raises ``PreemptedError`` after its
    checkpoint; under submitit that error then requeues the job through its ``checkpoint()``
    hook and exits (``experiments.engine.submitit_requeue.requeue``), elsewhere it propagates
    (the command exits with its ``exit_code``)."""
    with PreemptionGuard(preemption_signals(parse_signals(signal_names))) as guard:
        try:
            yield guard
        except PreemptedError as stopped:
            requeue(stopped.signum)  # under submitit: requeued, exits here
            raise


def preempted_results(
    stopped: PreemptedError, config: dict[str, Any], failures: dict[str, Any]
) -> dict[str, Any]:
    """The ``results.json`` of a job stopped by ``stopped`` after its checkpoint: ``status:
    "preempted"``, the ``signal``'s name, the ``step`` it stopped after, the ``config`` and the
    failure counts so far (running the command again resumes)."""
    return {
        "status": "preempted",
        "error": str(stopped),
        "signal": signal.Signals(stopped.signum).name,
        "step": stopped.step,
        "config": config,
        "failures": failures,
    }
