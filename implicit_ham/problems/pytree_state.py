"""Pytree variables for ``minimize`` / ``root``: a dict (or nested containers) of tensors.

The solvers work on a tuple of batch-first tensors (``StateSpec``); a pytree state is flattened
to its leaves (``torch.utils._pytree``, the structure ``torch.func`` uses) and the user's
function receives the pytree rebuilt from them, so ``loss(params, ...)`` can index
``params["fc.weight"]``. Every leaf is batch first and all share B (the number of independent
problems); ``module_state`` in ``parameters`` builds such a dict from an ``nn.Module``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import Tensor
from torch.utils import _pytree

Tree = Any


@dataclass(frozen=True)
class TreeState:
    """How a pytree state maps to the solvers' tuple of leaves.

    Attributes:
        spec: the pytree structure, or None when the user passed a Tensor or tuple of Tensors
            (handled by ``StateSpec`` as before).
        keys: each leaf's path (for messages), e.g. ``["fc.weight"]``.
    """

    spec: _pytree.TreeSpec | None
    keys: tuple[str, ...]

    @classmethod
    def of(cls, z0: Tree, where: str) -> TreeState:
        """Inspect ``z0``; raise a clear error for leaves that are not batch-first Tensors
        sharing one batch size."""
        if isinstance(z0, Tensor) or (
            isinstance(z0, (tuple, list)) and all(isinstance(t, Tensor) for t in z0)
        ):
            return cls(None, ())
        if not isinstance(z0, (dict, tuple, list)):
            raise TypeError(
                f"{where}: z0 must be a Tensor, a tuple of Tensors or a dict / pytree of "
                f"Tensors, got {type(z0).__name__}"
            )
        pairs, spec = _pytree.tree_flatten_with_path(z0)
        keys = tuple(_pytree.keystr(path) for path, _ in pairs)
        leaves = [leaf for _, leaf in pairs]
        if not leaves:
            raise ValueError(f"{where}: z0 is an empty pytree; there is nothing to solve")
        for key, leaf in zip(keys, leaves, strict=True):
            if not isinstance(leaf, Tensor) or leaf.ndim == 0:
                what = type(leaf).__name__ if not isinstance(leaf, Tensor) else "a scalar"
                raise TypeError(
                    f"{where}: the leaf z0{key} is {what}; every leaf must be a batch-first "
                    "Tensor (B, ...). For a network's weights use "
                    "ih.module_state(model), which adds the batch dimension."
                )
        sizes = {key: leaf.shape[0] for key, leaf in zip(keys, leaves, strict=True)}
        if len(set(sizes.values())) > 1:
            raise ValueError(
                f"{where}: the leaves of z0 have different batch sizes (dim 0): "
                f"{', '.join(f'z0{k}: {b}' for k, b in sizes.items())}. Every leaf is batch "
                "first with the same B (B independent problems); give the unbatched weights "
                "a leading dimension (ih.module_state(model, batch=B) does)."
            )
        return cls(spec, keys)

    def leaves(self, z: Tree) -> Tree:
        """The solvers' form: the tuple of leaves (a Tensor / tuple passes through)."""
        if self.spec is None:
            return z
        return tuple(_pytree.tree_leaves(z))

    def rebuild(self, z: Any) -> Tree:
        """The user's pytree from the solvers' tuple of leaves."""
        if self.spec is None:
            return z
        return _pytree.tree_unflatten(list(z), self.spec)

    def on_leaves(self, fn: Callable[..., Any], returns_tree: bool = False) -> Callable[..., Any]:
        """``fn`` (taking the user's pytree first) on the tuple of leaves; with
        ``returns_tree`` its pytree result (a root's g) is flattened the same way."""
        if self.spec is None:
            return fn

        def call(z: Any, *args: Any) -> Any:
            out = fn(self.rebuild(z), *args)
            if not returns_tree:
                return out
            flat, spec = _pytree.tree_flatten(out)
            if spec != self.spec:
                raise ValueError(
                    f"g must return the same pytree structure as z0 ({self.spec}), got {spec}"
                )
            return tuple(flat)

        return call
