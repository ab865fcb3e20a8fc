"""``pretrain_backbone`` on the ``Trainer`` against a hand-written AdamW loop: the same seed,
batches drawn by ``torch.randint`` from one seeded generator, the same steps, must give the
same backbone weights and validation accuracies, bit for bit."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from experiments.data.digit_canvas import CLEAN, SEG_CLASSES, digit_canvases
from experiments.models.backbone import LocalBackbone
from experiments.studies.pretraining import PretrainConf, pretrain_backbone


def test_pretraining_on_the_trainer_equals_a_hand_written_adamw_loop() -> None:
    conf = PretrainConf(width=4, images=6, steps=5, batch_size=3, lr=1e-2, seed=3)
    artefact = pretrain_backbone(conf)

    torch.manual_seed(conf.seed)
    images, masks = digit_canvases(conf.images, "train", CLEAN, seed=conf.seed)
    val_images, val_masks = digit_canvases(256, "val", CLEAN, conf.seed)
    backbone = LocalBackbone(1, conf.width)
    head = nn.Conv2d(conf.width, SEG_CLASSES, 1)
    optimizer = torch.optim.AdamW([*backbone.parameters(), *head.parameters()], lr=conf.lr)

    def logits(x: torch.Tensor) -> torch.Tensor:
        return F.interpolate(head(backbone(x)), size=x.shape[-2:], mode="bilinear")

    order = torch.Generator().manual_seed(conf.seed)
    for _ in range(conf.steps):
        batch = torch.randint(len(images), (conf.batch_size,), generator=order)
        loss = F.cross_entropy(logits(images[batch]), masks[batch])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    backbone.eval(), head.eval()
    with torch.no_grad():
        right = logits(val_images).argmax(1) == val_masks
    expected = backbone.state_dict()
    assert artefact["backbone"].keys() == expected.keys()
    assert all(torch.equal(artefact["backbone"][k], v) for k, v in expected.items())
    assert artefact["val_pixel_acc"] == float(right.float().mean())
    assert artefact["val_digit_acc"] == float(right[val_masks > 0].float().mean())
    assert artefact["config"]["steps"] == conf.steps
