"""Peak bytes of the tensor storages an operation allocates and keeps alive at once (CPU)."""

from __future__ import annotations

import weakref
from typing import Any

from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode


class LiveStorageBytes(TorchDispatchMode):
    """Tracks every storage first seen as an operator's output (storages that existed before,
    such as the input's, are not counted when first met through a view of them, as long as
    ``ignore`` names them) and its release (a finalizer on the storage); ``peak`` is the largest
    total alive at once, ``at_peak`` the (bytes, operator, shape) of each one alive then."""

    def __init__(self, ignore: tuple[Tensor, ...] = ()) -> None:
        super().__init__()
        self._ignore = {t.untyped_storage().data_ptr() for t in ignore}
        self._live: dict[int, tuple[int, str, tuple[int, ...]]] = {}
        self.current = 0
        self.peak = 0
        self.at_peak: list[tuple[int, str, tuple[int, ...]]] = []

    def _freed(self, key: int, nbytes: int) -> None:
        if self._live.pop(key, None) is not None:
            self.current -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out: Any = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if not isinstance(t, Tensor):
                continue
            storage = t.untyped_storage()
            key = storage.data_ptr()
            if key in self._live or key in self._ignore or storage.nbytes() == 0:
                continue
            self._live[key] = (storage.nbytes(), str(func), tuple(t.shape))
            self.current += storage.nbytes()
            weakref.finalize(storage, self._freed, key, storage.nbytes())
            if self.current > self.peak:
                self.peak, self.at_peak = self.current, list(self._live.values())
        return out
