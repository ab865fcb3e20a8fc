"""A counter of device-to-host synchronisations for the tests that bound them."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode


class HostSyncCounter(TorchDispatchMode):
    """Counts host reads: ``aten._local_scalar_dense`` (what ``.item()``, ``float()`` and
    ``bool()`` of a tensor dispatch to) and ``Tensor.tolist()``, which copies a tensor to the
    host without dispatching an operator on the CPU (one synchronisation on a device)."""

    def __init__(self) -> None:
        super().__init__()
        self.syncs = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            self.syncs += 1
        return func(*args, **(kwargs or {}))

    def __enter__(self) -> HostSyncCounter:
        original = Tensor.tolist
        counter = self

        def counted(tensor: Tensor, *args: Any, **kwargs: Any) -> Any:
            counter.syncs += 1
            return original(tensor, *args, **kwargs)

        self._original = original
        Tensor.tolist = counted  # type: ignore[method-assign]
        return super().__enter__()

    def __exit__(self, *exc: object) -> None:
        Tensor.tolist = self._original  # type: ignore[method-assign]
        super().__exit__(*exc)
