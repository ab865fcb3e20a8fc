"""The H3 synthetic tasks: the answer token sits exactly where each task says."""

from __future__ import annotations

import pytest
import torch

from experiments.data import h3_synthetics as h3


@pytest.mark.parametrize("vocab_size,length", [(20, 30), (6, 5)])
def test_induction_head_answer_is_the_token_after_the_first_prefix(vocab_size, length):
    gen = torch.Generator().manual_seed(0)
    prefix = h3.copy_prefix(vocab_size)
    positions = set()
    for _ in range(300):
        seq = h3.induction_head_example(vocab_size, length, gen)
        assert seq.shape == (length + 2,) and seq.dtype == torch.int64
        where = (seq == prefix).nonzero().flatten().tolist()
        assert len(where) == 2 and where[1] == length  # once inside, once before the answer
        assert where[0] < length - 2
        assert int(seq[-1]) == int(seq[where[0] + 1])
        ordinary = torch.cat([seq[: where[0]], seq[where[0] + 1 : length], seq[-1:]])
        assert bool((ordinary < vocab_size - 2).all())  # no special token elsewhere
        positions.add(where[0])
    assert positions == set(range(length - 2))  # the prefix can sit anywhere allowed


@pytest.mark.parametrize("vocab_size,length", [(10, 20), (20, 40), (8, 7)])
def test_associative_recall_answer_is_the_querys_value(vocab_size, length):
    gen = torch.Generator().manual_seed(1)
    ordinary, n_keys = vocab_size - 2, (vocab_size - 2) // 2
    for _ in range(300):
        seq = h3.associative_recall_example(vocab_size, length, gen)
        pairs = length // 2
        assert seq.shape == (2 * pairs + 3,)
        keys, values = seq[: 2 * pairs : 2], seq[1 : 2 * pairs : 2]
        assert bool((keys < n_keys).all())
        assert bool(((values >= n_keys) & (values < ordinary)).all())
        mapping = {}
        for k, v in zip(keys.tolist(), values.tolist(), strict=True):
            assert mapping.setdefault(k, v) == v  # one value per key within a sequence
        assert int(seq[-3]) == h3.copy_prefix(vocab_size)
        query, answer = int(seq[-2]), int(seq[-1])
        assert query in mapping and answer == mapping[query]


def test_splits_are_distinct_scored_on_the_final_position_and_reproducible():
    splits = h3.h3_synthetic("associative_recall", num_examples=300, num_test_examples=50)
    inputs, targets = splits.train.tensors
    assert inputs.shape == targets.shape == (300, 22) and splits.config.vocab_size == 10
    assert len({tuple(row) for row in inputs.tolist()}) == 300
    for x, y in (splits.train.tensors, splits.test.tensors):
        assert bool((y[:, :-1] == h3.IGNORE_INDEX).all())
        assert bool((x[:, -2] == h3.copy_prefix(10)).all())  # ... prefix, query | answer
        keys, values = x[:, :-2:2], x[:, 1:-2:2]
        matched = keys == x[:, -1:]  # where the query sits among the keys
        assert bool(matched.any(1).all())
        first = matched.int().argmax(1)
        assert torch.equal(values[torch.arange(len(x)), first], y[:, -1])
    again = h3.h3_synthetic("associative_recall", num_examples=300, num_test_examples=50)
    assert torch.equal(again.train.tensors[0], inputs)


def test_all_positions_targets_are_the_shifted_sequence():
    splits = h3.h3_synthetic(
        "induction_head", num_examples=50, num_test_examples=10, train_positions="all"
    )
    x, y = splits.train.tensors
    assert x.shape == (50, 31) and torch.equal(x[:, 1:], y[:, :-1])
    first = (x == h3.copy_prefix(20)).int().argmax(1)
    assert torch.equal(x[torch.arange(50), first + 1], y[:, -1])
    test_x, test_y = splits.test.tensors  # the test split is scored on the final position only
    assert bool((test_y[:, :-1] == h3.IGNORE_INDEX).all()) and test_x.shape == (10, 31)


def test_published_configurations():
    ih, ar = h3.PUBLISHED["induction_head"], h3.PUBLISHED["associative_recall"]
    assert (ih.vocab_size, ih.input_seq_len, ih.epochs) == (20, 30, 400)
    assert (ar.vocab_size, ar.input_seq_len, ar.epochs) == (10, 20, 200)
    assert (ih.num_examples, ih.num_test_examples) == (ar.num_examples, ar.num_test_examples)
    # the random-guess rows of the paper: 1 / vocabulary (IH), 1 / number of values (AR)
    assert 1 / ih.vocab_size == pytest.approx(0.05)
    assert 1 / ((ar.vocab_size - 2) - (ar.vocab_size - 2) // 2) == pytest.approx(0.25)


def test_bad_requests_are_refused():
    gen = torch.Generator().manual_seed(0)
    with pytest.raises(ValueError, match="vocab_size=3"):
        h3.associative_recall_example(3, 10, gen)
    with pytest.raises(ValueError, match="unknown H3 task"):
        h3.h3_synthetic("copying")
    with pytest.raises(ValueError, match="distinct sequences"):
        h3.h3_synthetic("induction_head", vocab_size=3, input_seq_len=3, num_examples=50)
    with pytest.raises(ValueError, match="positions="):
        h3.next_token_pairs(torch.zeros(2, 5, dtype=torch.long), "some")
