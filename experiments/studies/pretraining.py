"""Pretrain the local backbone on clean digits: the stand-in for the paper's ImageNet backbone.

``pretrain_backbone(PretrainConf(...))`` trains ``LocalBackbone`` with a per-pixel linear head
(no context: every pixel is classified from its 17-pixel neighbourhood alone) on digit_seg
canvases without occlusion or noise, each digit of an independent class, so the features learn
what a digit looks like and nothing about context. ``ensure_pretrained(path, conf)`` caches the
result: an artefact whose stored config equals ``conf`` is reused, anything else is an error
(never silently overwritten). ``load_backbone`` puts the weights into a segmenter.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from experiments.data.digit_canvas import CLEAN, SEG_CLASSES, digit_canvases
from experiments.engine.callbacks import Callback
from experiments.engine.checkpoint import read_checkpoint, write_checkpoint
from experiments.engine.state import TrainState
from experiments.engine.task import Task
from experiments.engine.tensor_batches import RandomBatches
from experiments.engine.trainer import StepFn, Trainer
from experiments.models.backbone import LocalBackbone

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PretrainConf:
    """What the pretrained artefact depends on (stored in it and compared on reuse).

    Attributes:
        width: backbone channels (the segmenter's ``model.width``).
        images: clean training canvases (5 digits each).
        steps: AdamW steps of batch ``batch_size`` at learning rate ``lr``.
        seed: initialisation, data and batch order.
        scan_seed: None, the fixed train / val scan split; an integer, the three-way split of
            ``digit_canvas.scan_split`` (a replicate of the paper-regime study pretrains on its
            own train scans only).
    """

    width: int = 32
    images: int = 1024
    steps: int = 400
    batch_size: int = 32
    lr: float = 3e-3
    seed: int = 0
    scan_seed: int | None = None


def pretrain_backbone(conf: PretrainConf) -> dict[str, Any]:
    """Train the backbone and a per-pixel head on clean canvases (one epoch of ``conf.steps``
    batches on the ``Trainer``); return the artefact: ``{"config", "backbone" (state dict),
    "val_pixel_acc", "val_digit_acc", "seconds"}`` (accuracies on 256 clean validation
    canvases; "digit" counts digit pixels only)."""
    torch.manual_seed(conf.seed)
    images, masks = digit_canvases(
        conf.images, "train", CLEAN, seed=conf.seed, scan_seed=conf.scan_seed
    )
    val_images, val_masks = digit_canvases(256, "val", CLEAN, conf.seed, conf.scan_seed)
    model = PixelClassifier(LocalBackbone(1, conf.width), nn.Conv2d(conf.width, SEG_CLASSES, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=conf.lr)
    batches = RandomBatches(images, masks, conf.steps, conf.batch_size, conf.seed)
    trainer = Trainer(
        model, Task("segmentation", SEG_CLASSES), optimizer_step(model, optimizer),
        device=torch.device("cpu"), callbacks=[LossLog("pretrain step", conf.steps)],
    )  # fmt: skip
    start = time.perf_counter()
    trainer.fit(batches, None, epochs=1)
    model.eval()
    with torch.no_grad():
        predicted = model(val_images).argmax(1)
    digit = val_masks > 0
    return {
        "config": dataclasses.asdict(conf),
        "backbone": model.backbone.state_dict(),
        "val_pixel_acc": float((predicted == val_masks).float().mean()),
        "val_digit_acc": float((predicted == val_masks)[digit].float().mean()),
        "seconds": time.perf_counter() - start,
    }


class PixelClassifier(nn.Module):
    """A backbone and a per-pixel head, the head's logits upsampled (bilinear) to the input:
    (B, 1, 64, 64) -> (B, classes, 64, 64)."""

    def __init__(self, backbone: nn.Module, head: nn.Module) -> None:
        super().__init__()
        self.backbone, self.head = backbone, head

    def forward(self, images: Tensor) -> Tensor:
        """(B, 1, H, W) -> (B, classes, H, W)."""
        logits = self.head(self.backbone(images))
        return F.interpolate(logits, size=images.shape[-2:], mode="bilinear")


def optimizer_step(model: nn.Module, optimizer: torch.optim.Optimizer) -> StepFn:
    """A ``Trainer`` step: cross-entropy of ``model(inputs)`` against the target, backward,
    ``optimizer.step()``; returns the (detached) loss."""

    def step(inputs: Tensor, target: Tensor, index: int) -> Tensor:
        loss = F.cross_entropy(model(inputs), target)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss.detach()

    return step


class LossLog(Callback):
    """Logs ``<what> <step>/<steps>  loss <loss>`` at every ``every``-th step (0-based)."""

    def __init__(self, what: str, steps: int, every: int = 100) -> None:
        self.what, self.steps, self.every = what, steps, every

    def on_step_end(self, trainer: Trainer, state: TrainState, loss: Tensor | None) -> None:
        """Log the step's loss when due."""
        step = state.step - 1
        if loss is not None and step % self.every == 0:
            logger.info("%s %d/%d  loss %.4f", self.what, step, self.steps, float(loss))


def ensure_pretrained(path: str | Path, conf: PretrainConf) -> dict[str, Any]:
    """The artefact at ``path``: read when it exists with this ``conf``, else trained and
    written. An artefact with another config raises (delete it or choose another path)."""
    path = Path(path)
    if path.exists():
        artefact = read_checkpoint(path)
        if _comparable(artefact["config"]) != _comparable(dataclasses.asdict(conf)):
            raise ValueError(
                f"{path} holds a backbone pretrained with {artefact['config']}, not "
                f"{dataclasses.asdict(conf)}; delete it or pass another --out"
            )
        logger.info("%s exists with this config; not retrained", path)
        return artefact
    artefact = pretrain_backbone(conf)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_checkpoint(path, artefact)
    logger.info(
        "pretrained backbone -> %s (clean val: pixel acc %.3f, digit acc %.3f, %.0f s)",
        path,
        artefact["val_pixel_acc"],
        artefact["val_digit_acc"],
        artefact["seconds"],
    )
    return artefact


def _comparable(config: dict[str, Any]) -> dict[str, Any]:
    """A stored config without options left at None (artefacts written before ``scan_seed``
    existed compare equal to the same options with ``scan_seed=None``)."""
    return {k: v for k, v in config.items() if v is not None}


def load_backbone(backbone: nn.Module, path: str | Path) -> None:
    """Load the artefact's weights into ``backbone`` (a ``LocalBackbone`` of the same width);
    a missing file or a width mismatch is an error naming the fix."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(
            f"pretrained backbone {path} does not exist; create it first with "
            f"`python -m experiments.pretrain --out {path}`"
        )
    artefact = read_checkpoint(path)
    width = artefact["config"]["width"]
    if getattr(backbone, "width", None) != width:
        raise ValueError(
            f"{path} holds a backbone of width {width}, the model's has width "
            f"{getattr(backbone, 'width', None)}; set model.width={width} or pretrain with "
            f"--width {getattr(backbone, 'width', None)}"
        )
    backbone.load_state_dict(artefact["backbone"])
