"""``EpochBatchSampler``: training batches whose order is a pure function of (seed, epoch).

The order of an epoch does not depend on how many epochs ran in this process, so a run resumed
from a checkpoint (epoch e, b batches consumed) sees exactly the batches it would have seen:
``set_position(e, b)`` and iterate. Under data parallelism every rank draws the same global
permutation and takes its contiguous slice of each global batch, so the union of the ranks'
batch i is the single-process batch i of a ``world_size`` times larger batch.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch
from torch.utils.data import Sampler

from implicit_ham.plugins import check_positive_int


def epoch_seed(seed: int, epoch: int) -> int:
    """A 63-bit generator seed derived from (seed, epoch) by numpy's ``SeedSequence`` (distinct
    pairs give unrelated streams, unlike ``seed + epoch``)."""
    state = np.random.SeedSequence([seed, epoch]).generate_state(1, dtype=np.uint64)[0]
    return int(state) & (2**63 - 1)


class EpochBatchSampler(Sampler[list[int]]):
    """Batches of dataset indices for one epoch at a time, resumable at any batch.

    Args:
        size: number of samples in the dataset.
        batch_size: samples per batch on each rank (the global batch is ``batch_size *
            world_size``).
        seed: the run's seed; epoch e uses the permutation seeded by ``epoch_seed(seed, e)``.
        rank, world_size: this process's slice of every global batch. A last global batch that
            cannot give every rank at least one sample is dropped when ``world_size > 1``.

    ``len(sampler)`` is the number of batches still to come in the current epoch.
    """

    def __init__(
        self,
        size: int,
        batch_size: int,
        *,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        check_positive_int("EpochBatchSampler", "size", size)
        check_positive_int("EpochBatchSampler", "batch_size", batch_size)
        check_positive_int("EpochBatchSampler", "world_size", world_size)
        if not 0 <= rank < world_size:
            raise ValueError(
                f"EpochBatchSampler: rank={rank} must lie in [0, world_size={world_size}); "
                "pass the process's rank from the launcher (torchrun sets RANK)."
            )
        self.size, self.batch_size, self.seed = size, batch_size, seed
        self.rank, self.world_size = rank, world_size
        self.epoch, self.start = 1, 0

    @property
    def batches_per_epoch(self) -> int:
        """Batches in a full epoch (the same on every rank)."""
        global_batch = self.batch_size * self.world_size
        full, rest = divmod(self.size, global_batch)
        return full + (1 if rest and (self.world_size == 1 or rest >= self.world_size) else 0)

    def set_position(self, epoch: int, batch: int = 0) -> None:
        """The next iteration yields epoch ``epoch`` from batch index ``batch`` on."""
        if not 0 <= batch <= self.batches_per_epoch:
            raise ValueError(
                f"EpochBatchSampler: batch={batch} is outside [0, {self.batches_per_epoch}] "
                "for this dataset and batch size; resume with the batch size it was saved with."
            )
        self.epoch, self.start = epoch, batch

    def __len__(self) -> int:
        return self.batches_per_epoch - self.start

    def __iter__(self) -> Iterator[list[int]]:
        generator = torch.Generator().manual_seed(epoch_seed(self.seed, self.epoch))
        order = torch.randperm(self.size, generator=generator)  # the epoch's sample order
        global_batch = self.batch_size * self.world_size
        for index in range(self.start, self.batches_per_epoch):
            chunk = order[index * global_batch : (index + 1) * global_batch]
            yield torch.tensor_split(chunk, self.world_size)[self.rank].tolist()
