"""A small convolutional DEQ classifier on sequences (B, C, N): the 1-D version of
``experiments.studies.deq_training.run``'s cell (``ConvCell``, which that study builds in 2-D),
solved by ``ih.fixed_point`` with the run's forward solver and backward mode."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import implicit_ham as ih
from implicit_ham.adjoints.modes import Adjoint
from implicit_ham.problems.fixed_point import Solution
from implicit_ham.solvers.base import FixedPointSolver


class ConvCell(nn.Module):
    """``f(z, x) = GroupNorm(ReLU(gain * conv(z) + x))``, kernel 3, on (B, C, N) (``dims=1``)
    or (B, C, H, W) (``dims=2``: the digits DEQ study's cell); ``gain`` a constant (small: the
    map starts contractive)."""

    def __init__(self, width: int, groups: int, gain: float, dims: int = 1) -> None:
        super().__init__()
        conv = nn.Conv1d if dims == 1 else nn.Conv2d
        self.conv = conv(width, width, 3, padding=1, bias=False)
        self.norm = nn.GroupNorm(groups, width)
        self.gain = gain

    def forward(self, z: Tensor, x: Tensor) -> Tensor:
        """z, x (B, C, N) or (B, C, H, W) -> the same shape."""
        return self.norm(F.relu(self.gain * self.conv(z) + x))


class DEQClassifier1d(nn.Module):
    """Stem and injection -> the cell's fixed point z* -> mean over positions -> linear head.

    An implicit layer to the engine: ``adjoint`` (the backward mode: Unroll, OneStep = JFB,
    Phantom, Neumann, Implicit) and ``last_solution`` (the latest training solve's
    ``Solution``: forward steps, residual) are read by the engine's solver summaries.
    ``stabilise="spectral"`` puts the spectral norm on the cell's convolution
    (``ih.nn.apply_norm``, the DEQ toolkit's stabiliser that bounds ``||gain * W||`` by gain).

    Args:
        in_channels, num_classes: the task's. width, groups: state channels and GroupNorm
        groups. gain: the cell's constant factor. solver, adjoint: the fixed-point solve's
        (None: the library's defaults). stabilise: None or "spectral".
    """

    def __init__(
        self,
        in_channels: int,
        num_classes: int,
        width: int = 32,
        groups: int = 4,
        gain: float = 0.5,
        solver: FixedPointSolver | None = None,
        adjoint: Adjoint | None = None,
        stabilise: str | None = None,
    ) -> None:
        super().__init__()
        if stabilise not in (None, "spectral"):
            raise ValueError(f"DEQClassifier1d: stabilise={stabilise!r}; use None or 'spectral'")
        self.stem = nn.Sequential(
            nn.Conv1d(in_channels, width, 5, padding=2), nn.GroupNorm(groups, width), nn.ReLU()
        )
        self.inject = nn.Conv1d(width, width, 1)
        self.cell = ConvCell(width, groups, gain)
        if stabilise == "spectral":
            ih.nn.apply_norm(self.cell, "spectral")
        self.head = nn.Linear(width, num_classes)
        self.solver = solver if solver is not None else ih.Anderson(max_steps=30, tol=1e-3)
        self.adjoint: Adjoint = adjoint if adjoint is not None else ih.OneStep()
        self.last_solution: Solution | None = None

    def forward(self, x: Tensor) -> Tensor:
        """x (B, C_in, N) -> logits (B, num_classes)."""
        inj = self.inject(self.stem(x))
        sol = ih.fixed_point(
            self.cell, torch.zeros_like(inj), inj, solver=self.solver, adjoint=self.adjoint
        )
        if self.training:
            self.last_solution = sol
        z = sol.value
        assert isinstance(z, Tensor)
        return self.head(z.mean(-1))
