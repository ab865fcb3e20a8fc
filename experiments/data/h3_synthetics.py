"""The H3 synthetic in-context tasks: induction head and associative recall.

Dao, Fu et al., "Hungry Hungry Hippos" (ICLR 2023), Table 2. The facts below are those of
HazyResearch/safari (``src/dataloaders/synthetics.py``; ``configs/dataset/icl_synthetics.yaml``,
``configs/pipeline/{induction_head,assoc_recall}.yaml``,
``configs/experiment/synthetics/{induction_head,associative_recall}/*.yaml``); the code is
written anew from them.

Vocabulary: ``vocab_size`` ids, of which the last two are special: ``vocab_size - 2`` is the
copy prefix (safari's "=>") and ``vocab_size - 1`` the no-op (safari's "."); ids
0 ... ``vocab_size - 3`` are the ordinary tokens. (safari numbers its string tokens in string
order, "10" before "2"; the relabelling changes nothing in the task.)

* **Induction head** (``induction_head_example``): ``input_seq_len`` ordinary tokens drawn
  uniformly; one position p, uniform in [0, input_seq_len - 2), becomes the copy prefix (the
  token after it, the one to recall, is left as drawn); then the copy prefix and that token are
  appended: ``input_seq_len + 2`` tokens, the prefix appearing exactly twice (at p and at
  ``input_seq_len``).
* **Associative recall** (``associative_recall_example``): the ordinary tokens split into keys
  (the first half) and values (the second); each key gets a value drawn uniformly (values may
  repeat across keys); ``input_seq_len // 2`` (key, value) pairs with keys drawn uniformly; then
  the copy prefix, a query key (drawn uniformly over all keys, and if it is not in the
  sequence, drawn again uniformly over the keys that are: safari's ``allow_dot=False``) and
  its value: ``2 * (input_seq_len // 2) + 3`` tokens.

A split: ``num_examples`` distinct sequences (duplicates drawn again, as safari's), shuffled;
inputs = sequence[:-1], targets = sequence[1:] (next-token prediction). The test targets are
the ignore index (-100) everywhere but the final position: the reported accuracy is the
final position's, whose target (the recalled token) is not in the input. safari trains on every
position's next token (a causal language model). A bidirectional mixer (the ``HamMixer``, the
mixers of ``implicit_ham.nn``) would read those targets from its input, so ``train_positions``
chooses: "final" (the default: train on the scored position only, right for every mixer) or
"all" (the published causal-LM objective, for causal models only).

Published configurations (``PUBLISHED``): induction head with vocabulary 20 and 30 input tokens
(the induction-head pipeline's override), associative recall with vocabulary 10 and 20 input
tokens (the ``-vs10`` experiments: ``vocab_size_10.yaml``; the paper's random-guess row, 25 %,
is one value in 4, i.e. this vocabulary), 5000 train / 500 test sequences, seed 0. Model and
optimiser of the transformer row: 2 layers, d_model 32, MLP width 4 d_model, 1 head, attention
dropout 0.1, embedding dropout 0.1, residual dropout 0, learned position embeddings; AdamW
lr 5e-4, weight decay 0.1, batch 32; induction head 400 epochs (cosine schedule, warm-up over
the first tenth of the epochs from 1e-6, floor 0.1 lr), associative recall 200 epochs in the
vs10 experiments (400 in the base config; linear warm-up over a tenth, linear decay).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.utils.data import TensorDataset

IGNORE_INDEX = -100
TASKS = ("induction_head", "associative_recall")
TRAIN_POSITIONS = ("final", "all")


@dataclass(frozen=True)
class SyntheticConfig:
    """One task's data configuration (the model and optimiser facts are in the module
    docstring; they belong to the trainer)."""

    task: str
    vocab_size: int
    input_seq_len: int
    num_examples: int = 5000
    num_test_examples: int = 500
    epochs: int = 400
    seed: int = 0


PUBLISHED = {
    "induction_head": SyntheticConfig("induction_head", vocab_size=20, input_seq_len=30),
    "associative_recall": SyntheticConfig(
        "associative_recall", vocab_size=10, input_seq_len=20, epochs=200
    ),
}


def copy_prefix(vocab_size: int) -> int:
    """The id of the copy prefix ("=>")."""
    return vocab_size - 2


def _check(task: str, vocab_size: int, input_seq_len: int) -> None:
    if task not in TASKS:
        raise ValueError(f"unknown H3 task {task!r}; choose one of {', '.join(TASKS)}")
    minimum = 4 if task == "associative_recall" else 3
    if vocab_size < minimum:
        raise ValueError(
            f"{task}: vocab_size={vocab_size} leaves fewer than {minimum - 2} ordinary tokens "
            f"beside the 2 special ones; use vocab_size >= {minimum}"
        )
    if input_seq_len < (3 if task == "induction_head" else 2):
        raise ValueError(
            f"{task}: input_seq_len={input_seq_len} is too short to hold the task; "
            "use at least 3 (induction head) or 2 (associative recall)"
        )


def _randint(high: int, generator: torch.Generator, size: int = 1) -> Tensor:
    return torch.randint(high, (size,), generator=generator)


def induction_head_example(
    vocab_size: int, input_seq_len: int, generator: torch.Generator
) -> Tensor:
    """One sequence (input_seq_len + 2,) int64; its last token is the one after the first copy
    prefix (see the module docstring)."""
    _check("induction_head", vocab_size, input_seq_len)
    seq = _randint(vocab_size - 2, generator, input_seq_len)
    position = int(_randint(input_seq_len - 2, generator))
    seq[position] = copy_prefix(vocab_size)
    answer = seq[position + 1 : position + 2]
    return torch.cat([seq, torch.tensor([copy_prefix(vocab_size)]), answer])


def associative_recall_example(
    vocab_size: int, input_seq_len: int, generator: torch.Generator
) -> Tensor:
    """One sequence (2 * (input_seq_len // 2) + 3,) int64: pairs, the copy prefix, a key seen
    in the pairs and its value (see the module docstring)."""
    _check("associative_recall", vocab_size, input_seq_len)
    ordinary = vocab_size - 2
    n_keys = ordinary // 2
    values = n_keys + _randint(ordinary - n_keys, generator, n_keys)  # value of each key
    keys = _randint(n_keys, generator, input_seq_len // 2)
    pairs = torch.stack([keys, values[keys]], dim=1).reshape(-1)
    query = int(_randint(n_keys, generator))
    if not bool((keys == query).any()):
        present = keys.unique()
        query = int(present[_randint(len(present), generator)])
    tail = torch.tensor([copy_prefix(vocab_size), query, int(values[query])])
    return torch.cat([pairs, tail])


EXAMPLES: dict[str, Callable[[int, int, torch.Generator], Tensor]] = {
    "induction_head": induction_head_example,
    "associative_recall": associative_recall_example,
}


def distinct_examples(config: SyntheticConfig, count: int, generator: torch.Generator) -> Tensor:
    """(count, L) distinct sequences, in random order; ValueError when the task has fewer
    than ``count`` distinct sequences within a generous number of draws."""
    make = EXAMPLES[config.task]
    seen: dict[tuple[int, ...], None] = {}
    draws, limit = 0, 20 * count + 1000
    while len(seen) < count:
        if draws >= limit:
            raise ValueError(
                f"{config.task}: only {len(seen)} distinct sequences in {draws} draws, "
                f"{count} asked; lower the count or enlarge vocab_size / input_seq_len"
            )
        seen.setdefault(tuple(make(config.vocab_size, config.input_seq_len, generator).tolist()))
        draws += 1
    rows = torch.tensor(list(seen))
    return rows[torch.randperm(count, generator=generator)]


def next_token_pairs(sequences: Tensor, positions: str) -> tuple[Tensor, Tensor]:
    """(inputs, targets) = (sequences[:, :-1], sequences[:, 1:]), the targets set to
    ``IGNORE_INDEX`` everywhere but the final position unless ``positions == "all"``."""
    if positions not in TRAIN_POSITIONS:
        raise ValueError(f"positions={positions!r}; choose one of {', '.join(TRAIN_POSITIONS)}")
    inputs, targets = sequences[:, :-1].clone(), sequences[:, 1:].clone()
    if positions == "final":
        targets[:, :-1] = IGNORE_INDEX
    return inputs, targets


@dataclass(frozen=True)
class SyntheticSplits:
    """Train and test sets of (inputs (L-1,), targets (L-1,)) int64 pairs, and the config."""

    train: TensorDataset
    test: TensorDataset
    config: SyntheticConfig


def h3_synthetic(
    task: str,
    *,
    vocab_size: int | None = None,
    input_seq_len: int | None = None,
    num_examples: int | None = None,
    num_test_examples: int | None = None,
    seed: int = 0,
    train_positions: str = "final",
) -> SyntheticSplits:
    """The task's train / test splits at the published configuration (``PUBLISHED[task]``),
    any field overridden by a keyword that is not None. Train first, then test, from one
    generator seeded with ``seed`` (the two splits may share a sequence, as safari's do)."""
    if task not in PUBLISHED:
        raise ValueError(f"unknown H3 task {task!r}; choose one of {', '.join(PUBLISHED)}")
    base = PUBLISHED[task]
    config = SyntheticConfig(
        task,
        vocab_size=base.vocab_size if vocab_size is None else vocab_size,
        input_seq_len=base.input_seq_len if input_seq_len is None else input_seq_len,
        num_examples=base.num_examples if num_examples is None else num_examples,
        num_test_examples=(
            base.num_test_examples if num_test_examples is None else num_test_examples
        ),
        epochs=base.epochs,
        seed=seed,
    )
    _check(task, config.vocab_size, config.input_seq_len)
    generator = torch.Generator().manual_seed(seed)
    train = distinct_examples(config, config.num_examples, generator)
    test = distinct_examples(config, config.num_test_examples, generator)
    return SyntheticSplits(
        TensorDataset(*next_token_pairs(train, train_positions)),
        TensorDataset(*next_token_pairs(test, "final")),
        config,
    )
