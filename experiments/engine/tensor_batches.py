"""Batches of in-memory tensors for one ``Trainer.fit`` epoch, in a seeded order the studies'
earlier hand-written loops used (so their numbers are unchanged): ``RandomBatches`` draws each
batch with replacement, ``PermutationBatches`` walks a permutation."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor


class _TensorBatches:
    """``steps`` batches of ``size`` rows of (inputs (N, ...), targets (N, ...)), drawn from one
    generator seeded with ``seed`` as they are iterated."""

    def __init__(self, inputs: Tensor, targets: Tensor, steps: int, size: int, seed: int) -> None:
        self.inputs, self.targets, self.steps, self.size = inputs, targets, steps, size
        self.generator = torch.Generator().manual_seed(seed)

    def __len__(self) -> int:
        return self.steps


class RandomBatches(_TensorBatches):
    """Each batch: ``size`` rows by ``torch.randint`` (with replacement)."""

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        for _ in range(self.steps):
            batch = torch.randint(len(self.inputs), (self.size,), generator=self.generator)
            yield self.inputs[batch], self.targets[batch]


class PermutationBatches(_TensorBatches):
    """Consecutive slices of a random permutation; a new permutation whenever the rest of the
    current one is shorter than a batch."""

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        perm, cursor = torch.randperm(len(self.inputs), generator=self.generator), 0
        for _ in range(self.steps):
            if cursor + self.size > len(perm):
                perm, cursor = torch.randperm(len(self.inputs), generator=self.generator), 0
            index = perm[cursor : cursor + self.size]
            cursor += self.size
            yield self.inputs[index], self.targets[index]
