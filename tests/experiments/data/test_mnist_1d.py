"""MNIST-1D from the mnist1d package, generated offline on a small set."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from experiments.data.mnist_1d import mnist1d_splits


def test_small_set_shapes_labels_and_scale():
    splits = mnist1d_splits(num_samples=200)
    x, y = splits.train.tensors
    x_test, y_test = splits.test.tensors
    assert x.shape == (160, 1, 40) and x_test.shape == (40, 1, 40)
    assert x.dtype == torch.float32 and y.dtype == torch.int64
    labels = torch.cat([y, y_test])
    assert torch.equal(labels.bincount(), torch.full((10,), 20))  # 200 // 10 per digit
    everything = torch.cat([x, x_test]).double()
    assert float(everything.mean()) == pytest.approx(0.0, abs=1e-5)
    assert float(everything.std(unbiased=False)) == pytest.approx(1.0, abs=1e-5)


def test_shuffled_variant_is_one_fixed_permutation_of_the_positions():
    plain = mnist1d_splits(num_samples=200)
    shuffled = mnist1d_splits(shuffle_seq=True, num_samples=200)
    assert shuffled.shuffle_seq and not plain.shuffle_seq
    a = torch.cat([plain.train.tensors[0], plain.test.tensors[0]])[:, 0]
    b = torch.cat([shuffled.train.tensors[0], shuffled.test.tensors[0]])[:, 0]
    assert torch.equal(plain.train.tensors[1], shuffled.train.tensors[1])
    # each shuffled column is exactly one of the plain columns, all of them once
    match = [[j for j in range(40) if torch.equal(b[:, i], a[:, j])] for i in range(40)]
    assert all(len(m) == 1 for m in match)
    perm = [m[0] for m in match]
    assert sorted(perm) == list(range(40)) and perm != list(range(40))


def test_the_callers_random_state_is_left_as_it_was():
    random.seed(7)
    np.random.seed(7)
    expected = (random.random(), np.random.rand())
    random.seed(7)
    np.random.seed(7)
    mnist1d_splits(num_samples=50)
    assert (random.random(), np.random.rand()) == expected
    with pytest.raises(ValueError, match="num_samples=5"):
        mnist1d_splits(num_samples=5)
