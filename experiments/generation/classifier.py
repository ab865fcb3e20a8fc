"""Train (or load from its cache) the digit classifier of the generation metrics.

It is trained on the training split of the digits (the same split the GAN's canvases use) as
half canvases (1, 32, 16), with random shifts of up to 1 pixel, and evaluated on the held-out
split. Training is deterministic (its own seeded generator, torch's global RNG untouched), so
every job of a sweep computes or loads the same network. The cache is a checkpoint file
(``experiments.engine.checkpoint``: atomic, checksummed) holding the weights, the held-out
accuracy and the settings it was trained with; a cache written with other settings is retrained.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from experiments.data.digits import load_digits_arrays, split_indices
from experiments.data.far_twins import COLUMNS_IN_HALF, digit_tensor, far_half_canvases
from experiments.data.twin_digits import DIGIT, TOP, upsample_digits
from experiments.engine.artefact_lock import artefact_lock
from experiments.engine.checkpoint import CheckpointError, read_checkpoint, write_checkpoint
from experiments.models.digit_classifier import HalfDigitClassifier

logger = logging.getLogger(__name__)

BATCH = 64
CLASSIFIER_VERSION = 2  # bump when HalfDigitClassifier or its training changes
LR = 2e-3
SHIFT = 1


def half_canvases(digits: Tensor) -> Tensor:
    """(N, 16, 16) digits -> (N, 1, 32, 16) halves, the digit at rows 8..23 as on a canvas."""
    out = digits.new_zeros(digits.shape[0], 1, 2 * DIGIT, DIGIT)
    out[:, 0, TOP : TOP + DIGIT] = digits
    return out


def digit_halves(split: str, val_fraction: float, seed: int) -> tuple[Tensor, Tensor]:
    """Half canvases (N, 1, 32, 16) and labels (N,) of one split of the digits."""
    images, labels = load_digits_arrays()
    chosen = split_indices(labels, val_fraction, seed)[split]
    return half_canvases(upsample_digits(images[chosen])), torch.from_numpy(labels[chosen])


def far_digit_halves(split: str, val_fraction: float, seed: int) -> tuple[Tensor, Tensor]:
    """Half canvases (2N, 1, 32, 16) and labels (2N,) of one split of the 8x8 digits, each digit
    at both places a far-twin canvas puts a digit inside its half
    (``experiments.data.far_twins``)."""
    images, labels = load_digits_arrays()
    chosen = split_indices(labels, val_fraction, seed)[split]
    digits, y = digit_tensor(images[chosen]), torch.from_numpy(labels[chosen])
    x = torch.cat([far_half_canvases(digits, column) for column in COLUMNS_IN_HALF])
    return x, y.repeat(len(COLUMNS_IN_HALF))


LAYOUTS = {"twin": digit_halves, "far": far_digit_halves}


def random_shift(x: Tensor, generator: torch.Generator) -> Tensor:
    """Each image shifted by up to ``SHIFT`` pixels in both directions (zero fill)."""
    padded = F.pad(x, (SHIFT, SHIFT, SHIFT, SHIFT))
    out = torch.empty_like(x)
    offsets = torch.randint(0, 2 * SHIFT + 1, (x.shape[0], 2), generator=generator).tolist()
    for i, (dy, dx) in enumerate(offsets):
        out[i] = padded[i, :, dy : dy + x.shape[2], dx : dx + x.shape[3]]
    return out


@torch.no_grad()
def accuracy(model: HalfDigitClassifier, x: Tensor, y: Tensor) -> float:
    """Share of ``x`` (N, 1, 32, 16) classified as ``y``."""
    model.eval()
    return float((model(x).argmax(1) == y).double().mean())


def train_classifier(
    epochs: int, val_fraction: float = 0.2, seed: int = 0, layout: str = "twin"
) -> tuple[HalfDigitClassifier, float]:
    """A classifier trained for ``epochs`` (AdamW, one-cycle schedule peaking at lr 2e-3,
    weight decay 0.01, batch 64) on the half canvases of ``layout`` ("twin": 16x16 twin digits,
    "far": 8x8 far twins) and its held-out accuracy; torch's global RNG is restored afterwards
    (initialisation and dropout draw from it under ``seed``)."""
    if layout not in LAYOUTS:
        raise ValueError(
            f"train_classifier: layout must be one of {sorted(LAYOUTS)}, got {layout!r}"
        )
    x_train, y_train = LAYOUTS[layout]("train", val_fraction, seed)
    x_val, y_val = LAYOUTS[layout]("val", val_fraction, seed)
    generator = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = HalfDigitClassifier()
        optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
        per_epoch = -(-len(x_train) // BATCH)
        schedule = torch.optim.lr_scheduler.OneCycleLR(
            optimizer, LR, total_steps=epochs * per_epoch
        )
        for _ in range(epochs):
            model.train()
            order = torch.randperm(len(x_train), generator=generator)
            for start in range(0, len(order), BATCH):
                idx = order[start : start + BATCH]
                logits = model(random_shift(x_train[idx], generator))
                loss = F.cross_entropy(logits, y_train[idx])
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                schedule.step()
    model.eval()
    return model, accuracy(model, x_val, y_val)


def load_or_train_classifier(
    cache: str | Path, epochs: int, val_fraction: float, seed: int, layout: str = "twin"
) -> tuple[HalfDigitClassifier, float]:
    """``_load_or_train_classifier`` under the cache's build lock: when the jobs of a sweep start
    together, one trains the classifier while the others wait, then load it."""
    with artefact_lock(cache):
        return _load_or_train_classifier(cache, epochs, val_fraction, seed, layout)


def _load_or_train_classifier(
    cache: str | Path, epochs: int, val_fraction: float, seed: int, layout: str
) -> tuple[HalfDigitClassifier, float]:
    """The cached classifier when ``cache`` holds one trained with these settings, else a newly
    trained one (then written to ``cache``)."""
    settings: dict[str, Any] = {
        "version": CLASSIFIER_VERSION,
        "epochs": epochs,
        "val_fraction": val_fraction,
        "seed": seed,
    }
    if layout != "twin":  # the twin caches written before layouts existed stay valid
        settings["layout"] = layout
    path = Path(cache)
    if path.exists():
        try:
            payload = read_checkpoint(path)
        except CheckpointError as err:
            logger.warning("%s; retraining the classifier", err)
        else:
            if payload["settings"] == settings:
                with torch.random.fork_rng(devices=[]):  # its random init is overwritten
                    model = HalfDigitClassifier()
                model.load_state_dict(payload["model"])
                return model.eval(), float(payload["accuracy"])
    model, acc = train_classifier(epochs, val_fraction, seed, layout)
    logger.info("digit classifier: held-out accuracy %.4f", acc)
    write_checkpoint(path, {"model": model.state_dict(), "accuracy": acc, "settings": settings})
    return model, acc


def main(argv: list[str] | None = None) -> None:
    """``python -m experiments.generation.classifier CACHE``: train the classifier with the
    generate config's defaults into CACHE once, before a sweep's jobs start (they load it)."""
    import argparse

    from experiments.generation.config import CanvasConf, GenMetricsConf

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("cache", help="the file, e.g. multirun/generate/classifier.pt")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    torch.set_num_threads(1)
    canvas, metrics = CanvasConf(), GenMetricsConf()
    _, acc = load_or_train_classifier(
        args.cache, metrics.classifier_epochs, canvas.val_fraction, canvas.seed
    )
    logger.info("classifier in %s: held-out accuracy %.4f", args.cache, acc)


if __name__ == "__main__":
    main()
