"""The GAN's training state and its update: hinge loss, one discriminator and one generator
update per step (TTUR learning rates), an exponential moving average of the generator.

Everything a resumed run needs is in ``state_dict``: both networks, the EMA generator, both
optimisers, the step and the dropped-update counts (the RNG states and failure counts are saved
beside it by ``experiments.generation.checkpoints``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
from torch.utils.data import Dataset

from experiments.engine.sampler import EpochBatchSampler
from experiments.generation.config import GanConf
from experiments.generation.guard import GuardedUpdate
from experiments.models.gan import Discriminator, Generator
from implicit_ham.reliability.failures import FailureMonitor


def hinge_d_loss(real_logits: Tensor, fake_logits: Tensor) -> Tensor:
    """``mean(relu(1 - D(x))) + mean(relu(1 + D(G(z))))``."""
    return F.relu(1.0 - real_logits).mean() + F.relu(1.0 + fake_logits).mean()


def hinge_g_loss(fake_logits: Tensor) -> Tensor:
    """``-mean(D(G(z)))``."""
    return -fake_logits.mean()


class StepBatches:
    """Training batches by global step: step s reads batch ``s mod b`` of epoch ``s // b + 1``
    of an ``EpochBatchSampler`` (b batches per epoch), so the batch of a step is a pure
    function of (seed, step) and a resumed run reads exactly the batches it would have read."""

    def __init__(self, images: Tensor, batch_size: int, seed: int) -> None:
        self.images = images
        self.sampler = EpochBatchSampler(len(images), batch_size, seed=seed)
        self.per_epoch = self.sampler.batches_per_epoch

    def from_step(self, step: int) -> Iterator[Tensor]:
        """Batches (B, 1, 32, 32) for steps ``step``, ``step + 1``, ... (endless)."""
        epoch, batch = divmod(step, self.per_epoch)
        while True:
            self.sampler.set_position(epoch + 1, batch)
            for indices in self.sampler:
                yield self.images[indices]
            epoch, batch = epoch + 1, 0


def canvases_of(dataset: Dataset) -> Tensor:
    """All canvases of a ``TwinDigitsDataset`` (N, 1, 32, 32) in [-1, 1]."""
    return dataset.canvases * 2.0 - 1.0  # type: ignore[attr-defined]


class GanTraining:
    """Networks, optimisers, EMA and guarded updates of one GAN run.

    Args:
        generator, discriminator: the networks (on the training device).
        cfg: the config's ``gan`` section (learning rates, betas, EMA decay).
        policy: the failure policy (``reliability.on_failure``). monitor: the failure monitor.
    """

    def __init__(
        self,
        generator: Generator,
        discriminator: Discriminator,
        cfg: GanConf,
        *,
        policy: str,
        monitor: FailureMonitor,
    ) -> None:
        self.G, self.D = generator, discriminator
        betas = (cfg.beta1, cfg.beta2)
        self.opt_g = torch.optim.Adam(self.G.parameters(), lr=cfg.lr_g, betas=betas)
        self.opt_d = torch.optim.Adam(self.D.parameters(), lr=cfg.lr_d, betas=betas)
        self.ema = AveragedModel(
            self.G, multi_avg_fn=get_ema_multi_avg_fn(cfg.ema_decay), use_buffers=True
        )
        limit = cfg.max_consecutive_failures
        nets = (self.G, self.D)
        self.update_d = GuardedUpdate(
            "D", self.opt_d, list(self.D.parameters()), nets, policy=policy, monitor=monitor,
            max_consecutive=limit,
        )  # fmt: skip
        self.update_g = GuardedUpdate(
            "G", self.opt_g, list(self.G.parameters()), nets, policy=policy, monitor=monitor,
            max_consecutive=limit,
        )  # fmt: skip
        self.step = 0

    def train_step(self, real: Tensor) -> dict[str, float]:
        """One D update on ``real`` (B, 1, 32, 32) and fresh fakes, then one G update; returns
        the finite losses (``loss/d``, ``loss/g``; a dropped update is left out)."""
        self.G.train()
        self.D.train()
        batch = real.shape[0]
        device = real.device

        def d_loss() -> Tensor:
            with torch.no_grad():
                fake = self.G(torch.randn(batch, self.G.z_dim, device=device))
            logits = self.D(torch.cat([real, fake]))  # one pass: D has no batch coupling
            return hinge_d_loss(logits[:batch], logits[batch:])

        def g_loss() -> Tensor:
            fake = self.G(torch.randn(batch, self.G.z_dim, device=device))
            return hinge_g_loss(self.D(fake))

        out: dict[str, float] = {}
        loss = self.update_d(d_loss, self.step)
        if loss is not None:
            out["loss/d"] = loss
        self.D.requires_grad_(False)
        try:
            loss = self.update_g(g_loss, self.step)
        finally:
            self.D.requires_grad_(True)
        if loss is not None:
            out["loss/g"] = loss
            self.ema.update_parameters(self.G)
        self.step += 1
        return out

    def gates(self) -> dict[str, float]:
        """The context gates' values (``gamma/g``, ``gamma/d``): how much context is used."""
        return {
            "gamma/g": float(self.G.context.gamma.detach()),
            "gamma/d": float(self.D.context.gamma.detach()),
        }

    def ema_generator(self) -> Generator:
        """The EMA generator (the averaged copy inside ``AveragedModel``)."""
        module = self.ema.module
        assert isinstance(module, Generator)
        return module

    @property
    def skipped(self) -> dict[str, int]:
        """Dropped updates so far, per network."""
        return {"D": self.update_d.skipped, "G": self.update_g.skipped}

    def state_dict(self) -> dict[str, Any]:
        """Networks, EMA, optimisers, step and dropped-update counts."""
        return {
            "G": self.G.state_dict(),
            "D": self.D.state_dict(),
            "ema": self.ema.state_dict(),
            "opt_g": self.opt_g.state_dict(),
            "opt_d": self.opt_d.state_dict(),
            "step": self.step,
            "skipped": self.skipped,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what ``state_dict`` saved."""
        self.G.load_state_dict(state["G"])
        self.D.load_state_dict(state["D"])
        self.ema.load_state_dict(state["ema"])
        self.opt_g.load_state_dict(state["opt_g"])
        self.opt_d.load_state_dict(state["opt_d"])
        self.step = int(state["step"])
        self.update_d.skipped = int(state["skipped"]["D"])
        self.update_g.skipped = int(state["skipped"]["G"])
