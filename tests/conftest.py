"""Shared fixtures: a small contractive fixed-point map in float64 for the core tests."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
from torch import Tensor


def tanh_layer(z: Tensor, x: Tensor, W: Tensor) -> Tensor:
    """``f(z, x, W) = tanh(z W^T + x)``; z, x: (B, n), W: (n, n)."""
    return torch.tanh(z @ W.T + x)


@dataclass(frozen=True)
class TanhProblem:
    """``z = tanh(z W^T + x)`` with ``||W||_2 = contraction < 1``, so the map is a contraction.

    Attributes:
        f: ``tanh_layer``. z0: (B, n) zeros. x: (B, n) input. W: (n, n) weight. Both x and W
        require grad, so they are the tensors the gradient must reach.
    """

    f: Callable[[Tensor, Tensor, Tensor], Tensor]
    z0: Tensor
    x: Tensor
    W: Tensor

    @property
    def args(self) -> tuple[Tensor, Tensor]:
        """The inputs of ``f`` after z: (x, W)."""
        return self.x, self.W


def build_tanh_problem(
    batch: int = 2, width: int = 4, contraction: float = 0.5, seed: int = 0
) -> TanhProblem:
    """A deterministic float64 ``TanhProblem``: W is random, rescaled to spectral norm
    ``contraction``; x is standard normal."""
    gen = torch.Generator().manual_seed(seed)
    W = torch.randn(width, width, generator=gen, dtype=torch.float64)
    W = contraction * W / torch.linalg.matrix_norm(W, ord=2)
    x = torch.randn(batch, width, generator=gen, dtype=torch.float64)
    z0 = torch.zeros(batch, width, dtype=torch.float64)
    return TanhProblem(tanh_layer, z0, x.requires_grad_(), W.requires_grad_())


@pytest.fixture
def tanh_problem() -> Callable[..., TanhProblem]:
    """Factory fixture: ``tanh_problem(batch=2, width=4, contraction=0.5, seed=0)``."""
    return build_tanh_problem


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test under tests/experiments and tests/docs ``experiments`` (they need the
    experiments extra), and skip tests marked ``cuda`` when no CUDA device is present."""
    root = config.rootpath / "tests"
    no_cuda = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        parts = item.path.relative_to(root).parts
        if parts[0] in ("experiments", "docs"):
            item.add_marker(pytest.mark.experiments)
        if "cuda" in item.keywords and not torch.cuda.is_available():
            item.add_marker(no_cuda)


@pytest.fixture(autouse=True)
def _fresh_event_ledger() -> None:
    """Every test starts with an empty event ledger (its rate limit is per process)."""
    from implicit_ham._core.events import events

    events().reset()
