"""The preemption guard in-process: a first signal only sets the flag, a second one exits at
once with 128 + its number and no checkpoint, and the previous handlers come back on exit.
(Two signals sent to a subprocess back to back merge into one pending signal, so the second
signal's path is driven here, by raising the signal in this process while the guard is on.)"""

from __future__ import annotations

import os
import signal

import pytest

from experiments.engine import preemption
from experiments.engine.preemption import PreemptionGuard


class ExitCalledError(Exception):
    pass


def test_first_signal_sets_the_flag_and_the_second_exits_at_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    codes: list[int] = []

    def fake_exit(code: int) -> None:
        codes.append(code)
        raise ExitCalledError

    monkeypatch.setattr(preemption.os, "_exit", fake_exit)
    before = signal.getsignal(signal.SIGUSR1)
    with PreemptionGuard([signal.SIGUSR1]) as guard:
        assert not guard.requested()
        os.kill(os.getpid(), signal.SIGUSR1)  # handled at the next bytecode: sets the flag
        assert guard.requested() and guard.signum == signal.SIGUSR1 and codes == []
        with pytest.raises(ExitCalledError):
            os.kill(os.getpid(), signal.SIGUSR1)
    assert codes == [128 + signal.SIGUSR1]
    assert "second SIGUSR1: exiting now, without a checkpoint" in caplog.text
    assert signal.getsignal(signal.SIGUSR1) == before
