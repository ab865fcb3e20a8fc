"""Each elastic-restart attempt gets a key space of its own in torchrun's shared store: a
restarted worker never reads the address a dead worker of the previous attempt wrote."""

from __future__ import annotations

import datetime

import pytest
import torch.distributed as dist

from experiments.engine.distributed import restart_store

TIMEOUT = datetime.timedelta(seconds=10)


def test_outside_a_torchrun_agent_store_env_rendezvous_is_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    assert restart_store(TIMEOUT) is None
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "False")
    assert restart_store(TIMEOUT) is None


def test_attempts_write_under_their_own_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    agent = dist.TCPStore("127.0.0.1", 0, None, is_master=True, timeout=TIMEOUT)  # the agent's
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(agent.port))
    monkeypatch.setenv("WORLD_SIZE", "2")
    stores = {}
    for attempt in ("0", "1"):
        monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", attempt)
        stores[attempt] = restart_store(TIMEOUT)
        assert stores[attempt] is not None
    stores["0"].set("rank_1", "address of a worker that died")
    assert agent.get("implicit_ham/attempt_0/rank_1") == b"address of a worker that died"
    assert not stores["1"].check(["rank_1"])  # the new attempt does not see the old key
    stores["1"].set("rank_1", "new address")
    assert stores["0"].get("rank_1") == b"address of a worker that died"
