"""Constraint sets by Euclidean projection, for ``minimize(..., constraint=...)``.

A constraint is a small frozen dataclass with ``project(z) -> z`` on the state's tensors. The
constrained minimum is the fixed point of the projected-gradient map
``z <- project(z - lr * grad_z loss(z))``, and the at-point backward modes differentiate that
fixed point (on the active set the projection's derivative is zero, so those entries receive no
gradient; on the free set the Hessian block is inverted). Only sets whose projection is a cheap
closed form are offered: the non-negative orthant and boxes. Equality constraints and general
convex sets are not supported.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch
from torch import Tensor

from implicit_ham._core.registry import Registry
from implicit_ham._core.state import State

CONSTRAINTS: Registry[Constraint] = Registry("constraint")
make_constraint = CONSTRAINTS.make_function("make_constraint", __name__)
register_constraint = CONSTRAINTS.register_function("register_constraint", __name__)


class Constraint(ABC):
    """A closed convex set given by its Euclidean projection."""

    @abstractmethod
    def project(self, z: State) -> State:
        """The nearest point of the set to each state tensor (same shapes, differentiable)."""

    @property
    def name(self) -> str:
        """The registry name of this constraint."""
        return CONSTRAINTS.name_of(self) or type(self).__name__


@CONSTRAINTS.register("nonnegative")
@dataclass(frozen=True)
class NonNegative(Constraint):
    """``z >= 0`` elementwise (NNLS, NMF's factors): ``project(z) = max(z, 0)``."""

    def project(self, z: State) -> State:
        return tuple(t.clamp_min(0) for t in z)


@CONSTRAINTS.register("box")
@dataclass(frozen=True)
class Box(Constraint):
    """``lower <= z <= upper`` elementwise: ``project(z) = clamp(z, lower, upper)``.

    Args:
        lower, upper: numbers, or tensors broadcastable to every state tensor (a bound that
            requires grad receives the gradient through the clamp on the active set).
    """

    lower: float | Tensor = 0.0
    upper: float | Tensor = 1.0

    def __post_init__(self) -> None:
        lo, hi = torch.as_tensor(self.lower), torch.as_tensor(self.upper)
        if bool((lo > hi).any()):
            raise ValueError(f"Box: lower must be <= upper, got {self.lower!r} > {self.upper!r}")

    def project(self, z: State) -> State:
        return tuple(_clamp(t, self.lower, self.upper) for t in z)


def _clamp(t: Tensor, lower: float | Tensor, upper: float | Tensor) -> Tensor:
    if isinstance(lower, Tensor) or isinstance(upper, Tensor):
        lo = torch.as_tensor(lower, dtype=t.dtype, device=t.device)
        hi = torch.as_tensor(upper, dtype=t.dtype, device=t.device)
        return torch.minimum(torch.maximum(t, lo), hi)
    return t.clamp(lower, upper)
