"""The structure of a fixed-point state: a Tensor or a tuple of Tensors, batch first.

Solvers work on tuples internally; ``StateSpec`` remembers the user's structure, checks that
``f`` returns the same structure, and flattens a state to one (B, N) matrix for the solvers that
need vectors (Anderson, Broyden, the linear solvers of the implicit backward pass).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

State = tuple[Tensor, ...]
StepFn = Callable[[State], State]


class BoundStep:
    """``z -> fn(z, inputs)``: a ``StepFn`` that keeps its explicit inputs (``fixed_point``'s
    args), so that a backward pass can re-evaluate the map at other values of them (the partial
    derivatives of a second derivative, see ``second_order``).

    Attributes:
        fn: ``(state, inputs) -> state``. inputs: the tensors passed to the map, in order.
    """

    def __init__(
        self, fn: Callable[[State, tuple[object, ...]], State], inputs: tuple[object, ...]
    ) -> None:
        self.fn, self.inputs = fn, inputs

    def __call__(self, z: State) -> State:
        return self.fn(z, self.inputs)

    def at(self, z: State, inputs: tuple[object, ...]) -> State:
        """The map at ``z`` with ``inputs`` in place of its own."""
        return self.fn(z, inputs)


@dataclass(frozen=True)
class StateSpec:
    """Shapes and dtypes of a state; ``is_tuple`` says whether the user passed a tuple."""

    shapes: tuple[torch.Size, ...]
    dtype: torch.dtype
    is_tuple: bool

    @classmethod
    def of(cls, z0: Tensor | Sequence[Tensor]) -> StateSpec:
        """Validate ``z0`` (a Tensor or a tuple of Tensors sharing batch size and dtype)."""
        if type(z0) is Tensor and z0.ndim and z0.is_floating_point():  # the common case
            return cls((z0.shape,), z0.dtype, False)
        parts = tuple(z0) if isinstance(z0, (tuple, list)) else (z0,)
        if not parts or not all(isinstance(t, Tensor) for t in parts):
            raise TypeError(
                f"z0 must be a Tensor or a non-empty tuple of Tensors, got {type(z0).__name__}"
            )
        for i, t in enumerate(parts):
            if t.ndim == 0:
                raise ValueError(f"z0: state[{i}] is a scalar; states are batch first (B, ...)")
            if not t.is_floating_point():
                raise TypeError(f"z0: state[{i}] has dtype {t.dtype}; a floating dtype is needed")
        batch = {t.shape[0] for t in parts}
        if len(batch) > 1:
            raise ValueError(
                f"z0: all state tensors must share the batch size (dim 0), got "
                f"{[tuple(t.shape) for t in parts]}"
            )
        dtypes = {t.dtype for t in parts}
        if len(dtypes) > 1:
            raise TypeError(
                f"z0: all state tensors must share one dtype, got {sorted(map(str, dtypes))}"
            )
        return cls(tuple(t.shape for t in parts), parts[0].dtype, isinstance(z0, (tuple, list)))

    @property
    def batch(self) -> int:
        """Batch size B."""
        return self.shapes[0][0]

    def as_tuple(self, z: Tensor | Sequence[Tensor]) -> State:
        """The internal tuple form of a user-structured state."""
        if self.is_tuple:
            return tuple(z)
        assert isinstance(z, Tensor)
        return (z,)

    def restore(self, z: State) -> Tensor | State:
        """The user's structure (a Tensor or a tuple) from the internal tuple form."""
        return tuple(z) if self.is_tuple else z[0]

    def check(self, z: object, where: str) -> State:
        """Validate a value returned by ``f``; raise a clear error on a structure mismatch."""
        parts = tuple(z) if isinstance(z, (tuple, list)) else (z,)
        expected = [tuple(s) for s in self.shapes]
        if isinstance(z, (tuple, list)) != self.is_tuple or len(parts) != len(self.shapes):
            raise ValueError(
                f"{where}: f must return the same structure as z0 "
                f"({'a tuple of ' + str(len(expected)) if self.is_tuple else 'a single Tensor'}"
                f" with shapes {expected}), got {_describe(z)}"
            )
        for i, (t, shape) in enumerate(zip(parts, self.shapes, strict=True)):
            if not isinstance(t, Tensor) or t.shape != shape:
                raise ValueError(
                    f"{where}: f returned state[{i}] with shape "
                    f"{tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__}, "
                    f"but z0 has shape {tuple(shape)}; f(z, *args) must preserve every shape"
                )
            if t.dtype != self.dtype:
                raise TypeError(
                    f"{where}: f returned state[{i}] with dtype {t.dtype}, but z0 has dtype "
                    f"{self.dtype}; the state would be silently promoted. Give z0 and the "
                    f"arguments of f one dtype (e.g. z0.to({t.dtype}) or x.to({self.dtype}))."
                )
        return parts

    def flatten(self, z: State) -> Tensor:
        """(B, N): each sample's state tensors concatenated (one tensor: a reshape of it, a view
        where its layout allows, not a copy)."""
        if len(z) == 1:
            return z[0].reshape(self.batch, -1)
        return torch.cat([t.reshape(self.batch, -1) for t in z], dim=1)

    def unflatten(self, flat: Tensor) -> State:
        """Inverse of ``flatten``: (B, N) (or any shape of B * N entries) -> tuple of tensors
        with the spec's shapes."""
        if len(self.shapes) == 1:  # one tensor: a view, no split (fewer autograd nodes)
            return (flat if flat.shape == self.shapes[0] else flat.reshape(self.shapes[0]),)
        sizes = [s.numel() // s[0] for s in self.shapes]
        chunks = torch.split(flat.reshape(self.batch, -1), sizes, dim=1)
        return tuple(c.reshape(s) for c, s in zip(chunks, self.shapes, strict=True))

    def zeros_like_missing(self, parts: Sequence[Tensor | None], like: State) -> State:
        """Replace ``None`` gradients by zeros of the matching state tensor."""
        return tuple(
            torch.zeros_like(r) if p is None else p for p, r in zip(parts, like, strict=True)
        )


def detached(z: State) -> State:
    """The state's tensors detached from the graph (same storage)."""
    return tuple(t.detach() for t in z)


def with_gradient_of(value: State, carrier: State) -> State:
    """``value + (carrier - carrier.detach())`` per tensor: the values of ``value`` (exactly,
    for finite ``carrier``) with the gradient of ``carrier``. A backward mode that needs other
    forward steps than the solver's uses this to get them for its gradient only."""
    return tuple(
        v.detach() + (c - c.detach()) for v, c in zip(value, carrier, strict=True)
    )


def per_tensor_norms(z: State) -> Tensor:
    """(B, n_tensors): the Euclidean norm of each sample's part of each state tensor."""
    return torch.stack([_norm_per_sample(t) for t in z], dim=1)


def _norm_per_sample(t: Tensor) -> Tensor:
    """(B,): the norm of each sample of ``t`` (B, ...), without copying a non-contiguous t."""
    return t.abs() if t.ndim == 1 else torch.linalg.vector_norm(t, dim=tuple(range(1, t.ndim)))


def combine_norms(parts: Tensor) -> Tensor:
    """(B, n) per-tensor norms -> (B,) the norm of their concatenation, without overflowing
    when the parts are finite (the parts are scaled by their maximum first)."""
    scale = parts.amax(dim=1, keepdim=True).clamp_min(torch.finfo(parts.dtype).tiny)
    return scale[:, 0] * torch.linalg.vector_norm(parts / scale, dim=1)


def per_sample_norm(z: State) -> Tensor:
    """(B,): the Euclidean norm of each sample's whole state."""
    return combine_norms(per_tensor_norms(z))


def finite_flags(z: State) -> Tensor:
    """(n_tensors,) bool: whether each state tensor is entirely finite (no host sync)."""
    return torch.stack([torch.isfinite(t).all() for t in z])


def _describe(z: object) -> str:
    if isinstance(z, Tensor):
        return f"a Tensor of shape {tuple(z.shape)}"
    if isinstance(z, (tuple, list)):
        inner = ", ".join(_describe(t) for t in z)
        return f"a {type(z).__name__} of {len(z)} ({inner})"
    return f"a {type(z).__name__}"
