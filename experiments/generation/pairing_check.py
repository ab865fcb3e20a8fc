"""Can the discriminator learn the pairing at all? A supervised check before any GAN.

The job's discriminator (spectral norm, its context gate at a given initial gamma) is trained
with binary cross-entropy to tell real far-twin canvases (label 1) from recombined ones whose two
real digits disagree (label 0, ``experiments.generation.d_probe.mismatched``), on the mean of its
two digit cells' logits; the score is the balanced accuracy on val canvases (digit scans disjoint
from train's). A design whose discriminator stays at chance here cannot pass the pilot gate.

    python -m experiments.generation.pairing_check --out docs/generation/pairing_check.json
"""

from __future__ import annotations

import argparse
import json
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from experiments.data.far_twins import FarTwinsDataset
from experiments.generation.d_probe import mismatched, pair_logits
from experiments.generation.job import GanJob, build_networks

logger = logging.getLogger(__name__)

CASES = (("self_attention", 0.0), ("self_attention", 1.0), ("nmf_one_step", 1.0))


@torch.no_grad()
def balanced_accuracy(discriminator: nn.Module, canvases: Tensor, labels: Tensor) -> float:
    """Mean of the accuracy on real canvases (logit > 0) and on their recombinations (< 0)."""
    discriminator.eval()
    try:
        real = (pair_logits(discriminator, canvases) > 0).float().mean()
        fake = (pair_logits(discriminator, mismatched(canvases, labels)) < 0).float().mean()
    finally:
        discriminator.train()
    return float((real + fake) / 2)


def check(
    job: GanJob, steps: int, batch: int = 64, every: int = 500, val: int = 1000
) -> list[dict[str, float]]:
    """Train ``job``'s discriminator on the pairing for ``steps`` Adam steps (the job's lr_d and
    betas); returns rows ``{step, val_accuracy, gamma}`` every ``every`` steps and at the end."""
    if steps < 1 or every < 1 or batch < 2 or val < 2:
        raise ValueError(f"check: steps, every >= 1, batch, val >= 2; got {steps}, {every}, "
                         f"{batch}, {val}")  # fmt: skip
    train = FarTwinsDataset("train", size=job.train_size, seed=job.seed)
    held = FarTwinsDataset("val", size=val, seed=job.seed)
    _, discriminator = build_networks(job)
    optimiser = torch.optim.Adam(discriminator.parameters(), lr=job.lr_d,
                                 betas=(job.beta1, job.beta2))  # fmt: skip
    batches = torch.Generator().manual_seed(job.seed)
    rows = []
    for step in range(steps + 1):
        if step % every == 0 or step == steps:
            rows.append({"step": step,
                         "val_accuracy": balanced_accuracy(discriminator, held.canvases,
                                                           held.labels),
                         "gamma": float(discriminator.context.gamma.detach())})  # fmt: skip
        if step == steps:
            break
        index = torch.randint(0, len(train), (batch,), generator=batches)
        real, labels = train.canvases[index], train.labels[index]
        fake = mismatched(real, labels)
        logits = torch.cat([pair_logits(discriminator, real), pair_logits(discriminator, fake)])
        target = torch.cat([torch.ones(len(real)), torch.zeros(len(fake))])
        loss = F.binary_cross_entropy_with_logits(logits, target)
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    return rows


def main(argv: list[str] | None = None) -> None:
    """Run ``CASES`` (arm, initial gamma of the discriminator's gate) and write the JSON file."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=2000)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    torch.set_num_threads(1)
    result: list[dict[str, Any]] = []
    for arm, gate in CASES:
        rows = check(replace(GanJob(arm=arm, seed=0), d_gate_init=gate), args.steps)
        logger.info("%s, gate %g: val accuracy %.3f", arm, gate, rows[-1]["val_accuracy"])
        result.append({"arm": arm, "d_gate_init": gate, "steps": args.steps, "curve": rows})
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
