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
from experiments.engine.checkpoint import read_checkpoint, write_checkpoint
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
    """Train the backbone and a per-pixel head on clean canvases; return the artefact:
    ``{"config", "backbone" (state dict), "val_pixel_acc", "val_digit_acc", "seconds"}``
    (accuracies on 256 clean validation canvases; "digit" counts digit pixels only)."""
    torch.manual_seed(conf.seed)
    images, masks = digit_canvases(
        conf.images, "train", CLEAN, seed=conf.seed, scan_seed=conf.scan_seed
    )
    val_images, val_masks = digit_canvases(256, "val", CLEAN, conf.seed, conf.scan_seed)
    backbone = LocalBackbone(1, conf.width)
    head = nn.Conv2d(conf.width, SEG_CLASSES, 1)
    model = nn.Sequential(backbone, head)
    optimizer = torch.optim.AdamW(model.parameters(), lr=conf.lr)
    order = torch.Generator().manual_seed(conf.seed)
    start = time.perf_counter()
    model.train()
    for step in range(conf.steps):
        batch = torch.randint(len(images), (conf.batch_size,), generator=order)
        loss = F.cross_entropy(_logits(model, images[batch]), masks[batch])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % 100 == 0:
            logger.info("pretrain step %d/%d  loss %.4f", step, conf.steps, float(loss.detach()))
    model.eval()
    with torch.no_grad():
        predicted = _logits(model, val_images).argmax(1)
    digit = val_masks > 0
    return {
        "config": dataclasses.asdict(conf),
        "backbone": backbone.state_dict(),
        "val_pixel_acc": float((predicted == val_masks).float().mean()),
        "val_digit_acc": float((predicted == val_masks)[digit].float().mean()),
        "seconds": time.perf_counter() - start,
    }


def _logits(model: nn.Module, images: Tensor) -> Tensor:
    """(B, 1, 64, 64) -> (B, classes, 64, 64): the head's logits upsampled to the input."""
    return F.interpolate(model(images), size=images.shape[-2:], mode="bilinear")


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
