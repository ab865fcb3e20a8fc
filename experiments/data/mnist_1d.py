"""MNIST-1D (Greydanus, "Scaling down deep learning", 2020): the ``mnist1d`` package's data,
generated offline by the package (``mnist1d.data.make_dataset``; nothing is downloaded).

The package's default configuration (``get_dataset_args``): 5000 sequences of 40 samples, 500
per digit, the first 80 % (4000) for training and the rest (1000) for testing after a seeded
shuffle, seed 42; the whole set centred and scaled to standard deviation 1. The shuffled variant
(``shuffle_seq=True``) applies one fixed random permutation to the 40 positions of every
sequence (local structure gone, only global context helps); everything else is unchanged, so
its sequences are exactly the default ones with their positions permuted.

The published numbers were measured on the package's frozen pickle of the default data; that
the generator reproduces it bit for bit (same numpy) is the package's claim, not checked here
(no network). The package seeds numpy's and Python's global generators; ``mnist1d_splits``
restores both afterwards, so building the data leaves the caller's random state as it was.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import TensorDataset

NUM_CLASSES = 10
LENGTH = 40


@dataclass(frozen=True)
class Mnist1DSplits:
    """Train and test sets of (x (1, 40) float32, label int64): sequences (C=1, N=40)."""

    train: TensorDataset
    test: TensorDataset
    shuffle_seq: bool


def mnist1d_splits(
    shuffle_seq: bool = False, num_samples: int = 5000, seed: int = 42
) -> Mnist1DSplits:
    """The package's default MNIST-1D (or its shuffled variant); ``num_samples`` and ``seed``
    change the package's arguments of the same name (defaults: the published data)."""
    try:
        from mnist1d.data import get_dataset_args, make_dataset  # type: ignore[import-untyped]
    except ImportError as error:  # an optional dependency of the experiments
        raise ImportError(
            "MNIST-1D needs the mnist1d package: pip install mnist1d (the experiments extra)"
        ) from error
    if num_samples < NUM_CLASSES:
        raise ValueError(f"num_samples={num_samples}: need at least one sequence per digit (10)")
    args = get_dataset_args()
    args.num_samples, args.seed, args.shuffle_seq = num_samples, seed, shuffle_seq
    python_state, numpy_state = random.getstate(), np.random.get_state()
    try:
        data = make_dataset(args)
    finally:
        random.setstate(python_state)
        np.random.set_state(numpy_state)

    def split(x: np.ndarray, y: np.ndarray) -> TensorDataset:
        inputs = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).unsqueeze(1)
        return TensorDataset(inputs, torch.from_numpy(y.astype(np.int64)))

    return Mnist1DSplits(
        split(data["x"], data["y"]), split(data["x_test"], data["y_test"]), shuffle_seq
    )
