"""Data-parallel training under ``torchrun``: the process group, the model wrapper and the few
collectives the training loop needs.

``DistributedContext.from_env`` reads what torchrun sets (``WORLD_SIZE``, ``RANK``,
``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT``) and joins the process group: ``nccl`` on CUDA
(one GPU per process, ``cuda:LOCAL_RANK``), ``gloo`` on the CPU. Without torchrun (or with one
process) it is the trivial single-process context and every collective is the identity, so the
loop has one code path.

A peer that hangs (stopped, deadlocked, its node gone) would block every other rank forever in
its next collective. The process group is created with a timeout (``reliability.dist_timeout_s``,
default 300 s): a collective that waits longer fails, and ``diagnose_hangs`` turns that failure
into ``DistributedTimeoutError`` naming the ranks that did not answer (found with gloo's
``monitored_barrier`` on a side group of its own, so the diagnosis does not depend on the
failed group's state).

After an elastic restart (``torchrun --max-restarts``) the workers of the new attempt join
torchrun's shared TCP store again, which still holds the keys the previous attempt's process
group wrote: the gloo mesh could read a dead worker's address and fail with "connectFullMesh
failed ... Connection refused" (a race: it works when the new peer overwrites its key first).
``restart_store`` gives each attempt a key space of its own (``TORCHELASTIC_RESTART_COUNT``).
"""

from __future__ import annotations

import datetime
import hashlib
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from experiments.engine.sync_batchnorm import convert_batchnorm

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 300.0


class DistributedTimeoutError(RuntimeError):
    """A collective waited longer than the process-group timeout; the message names this rank
    and the ranks that did not answer."""


@dataclass(frozen=True)
class DistributedContext:
    """This process's place in the job.

    Attributes:
        rank: global rank (0 is the main process: it logs, checkpoints and writes results).
        world_size: number of processes.
        local_rank: rank on this node (selects the GPU).
        device: the device this process trains on.
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    timeout_s: float = DEFAULT_TIMEOUT_S
    side_group: Any = field(default=None, compare=False, repr=False)

    @property
    def enabled(self) -> bool:
        """Whether more than one process takes part."""
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Whether this is rank 0."""
        return self.rank == 0

    @classmethod
    def from_env(cls, device: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> DistributedContext:
        """Join torchrun's process group if ``WORLD_SIZE > 1``; else the single-process context.

        Args:
            device: the configured device ("cpu", "cuda", "cuda:0", ...). Under torchrun a CUDA
                device becomes ``cuda:LOCAL_RANK``.
            timeout_s: how long a collective may wait for a peer (> 0) before it fails.
        """
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
        if world_size <= 1:
            return cls(device=torch.device(device))
        rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
        target = torch.device(device)
        if target.type == "cuda":
            target = torch.device("cuda", local_rank)
            torch.cuda.set_device(target)
        elif target.type != "cpu":
            raise ValueError(
                f"distributed training supports device=cpu (gloo) or cuda (nccl), got "
                f"{device!r}; set device=cpu or device=cuda."
            )
        timeout = datetime.timedelta(seconds=float(timeout_s))
        if not dist.is_initialized():
            backend = "nccl" if target.type == "cuda" else "gloo"
            device_id = target if target.type == "cuda" else None
            store = restart_store(timeout)
            via: dict[str, Any] = {}  # env://, which reads the rank and world size
            if store is not None:
                via = {"store": store, "rank": rank, "world_size": world_size}
            dist.init_process_group(backend, timeout=timeout, device_id=device_id, **via)
        side = dist.new_group(backend="gloo", timeout=timeout)
        return cls(rank, world_size, local_rank, target, float(timeout_s), side)

    @contextmanager
    def diagnose_hangs(self) -> Iterator[None]:
        """Turn a collective that timed out in the body into ``DistributedTimeoutError`` naming
        the ranks that did not answer (a no-op in one process)."""
        try:
            yield
        except DistributedTimeoutError:
            raise
        except RuntimeError as err:
            if not self.enabled or not _is_timeout(err):
                raise
            raise DistributedTimeoutError(self._hang_report(err)) from err

    def _hang_report(self, err: RuntimeError) -> str:
        """Who did not answer: rank 0 waits for every rank at a monitored barrier (the others
        check in with rank 0), bounded by the same timeout."""
        wait = datetime.timedelta(seconds=min(self.timeout_s, 30.0))
        try:
            dist.monitored_barrier(group=self.side_group, timeout=wait, wait_all_ranks=True)
        except RuntimeError as barrier:
            found = str(barrier).splitlines()[0]
            if self.rank != 0 and "monitoredBarrier" not in found:
                found = f"rank 0 did not answer ({found})"
        else:
            found = "every rank answered the check afterwards (a slow rank, not a dead one)"
        return (
            f"rank {self.rank} of {self.world_size}: a collective waited more than "
            f"reliability.dist_timeout_s={self.timeout_s:g} s for a peer ({err}); {found}. A "
            "peer is hung (stopped, deadlocked) or its node is gone: look at that rank's log; "
            "raise reliability.dist_timeout_s if it is only slow. Rerun the command to resume "
            "from the last checkpoint."
        )

    def wrap(self, model: nn.Module) -> nn.Module:
        """``model`` (already on ``device``) with BatchNorm synchronised across processes and
        wrapped in ``DistributedDataParallel``; unchanged in a single process."""
        if not self.enabled:
            return model
        model = convert_batchnorm(model)
        ids = [self.device.index] if self.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids)

    def max_code(self, code: int) -> int:
        """The largest ``code`` over all processes (a decision every rank takes together)."""
        if not self.enabled:
            return code
        value = torch.tensor([code], dtype=torch.int64, device=self.collective_device)
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return int(value.item())

    def sum(self, values: list[float]) -> list[float]:
        """Element-wise sums of ``values`` over all processes (float64)."""
        if not self.enabled:
            return list(values)
        tensor = torch.tensor(values, dtype=torch.float64, device=self.collective_device)
        dist.all_reduce(tensor)
        return tensor.tolist()

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every process (picklable objects)."""
        if not self.enabled:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather(self, obj: Any) -> list[Any]:
        """``[obj of rank 0, obj of rank 1, ...]`` on every process."""
        if not self.enabled:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    @property
    def collective_device(self) -> torch.device:
        """Where small collective tensors live (nccl needs the GPU)."""
        return self.device if self.device.type == "cuda" else torch.device("cpu")

    def close(self) -> None:
        """Wait for every process, then leave the process group (no-op in one process)."""
        if self.enabled and dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()


def restart_store(timeout: datetime.timedelta) -> dist.Store | None:
    """torchrun's agent store under a prefix of this attempt
    (``implicit_ham/attempt_<restart count>``), or None (then ``env://`` as usual) outside a
    torchrun agent that shares its store."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    client = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
        int(os.environ["WORLD_SIZE"]), is_master=False, timeout=timeout,
    )  # fmt: skip
    return dist.PrefixStore(f"implicit_ham/attempt_{attempt}", client)


def state_digest(module: nn.Module) -> str:
    """SHA-256 of every tensor of ``module.state_dict()`` (parameters and buffers, in key
    order): equal digests on two ranks mean bit-identical replicas."""
    digest = hashlib.sha256()
    for key, tensor in module.state_dict().items():
        digest.update(key.encode())
        digest.update(tensor.detach().cpu().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _is_timeout(err: RuntimeError) -> bool:
    """Whether ``err`` is a collective's timeout: gloo says "timed out" in a wait, and
    "Application timeout caused pair closure" when its connection to the peer is closed on
    the timeout (which of the two a hung peer causes depends on where the collective waits)."""
    message = str(err).lower()
    return "timed out" in message or "timeout" in message
