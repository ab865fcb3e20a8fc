"""One job of the generation comparison: train a local GAN (``experiments.generation.nets``) with
one context arm on far-twin canvases and score its EMA generator.

Pairing by seed: the backbone of both networks is initialised from ``seed`` with the context
block built under its own RNG stream (``seed + CONTEXT_STREAM``), so every arm of a seed starts
from the same backbone weights, and arms that differ only in their gradient (``nmf_one_step``,
``nmf_unroll``) start from identical networks. The batches and the training noise maps come from
a generator seeded with ``seed`` alone: the same for every arm of a seed. The hinge loss, Adam
with SAGAN's two learning rates and one D and one G update per step are HamGAN's / SAGAN's.

Every ``eval_every`` steps the EMA generator's ``curve_samples`` samples (fixed latents) are
scored (FID, KID, precision, recall, consistency): the curves of the page; the gates' gamma of
both networks are recorded every ``gate_every`` steps.
"""

from __future__ import annotations

import logging
import math
import resource
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from experiments.data.far_twins import FarTwinsDataset
from experiments.data.twin_digits import to_gan_range
from experiments.generation.d_probe import digit_cells, mismatch_gap, mismatched
from experiments.generation.evaluate import features_of, sample_canvases, save_grid, score
from experiments.generation.nets import NETWORK, LocalDiscriminator, LocalGenerator
from experiments.generation.trainer import hinge_d_loss, hinge_g_loss
from experiments.models.digit_classifier import CanvasFeatures, HalfDigitClassifier
from experiments.models.gan import parameter_count
from implicit_ham.adjoints.modes import OneStep, Unroll
from implicit_ham.nn.context import make_context

logger = logging.getLogger(__name__)

CONTEXT_STREAM = 1000
# arm -> (context name, gradient of a decomposition or None)
ARMS: dict[str, tuple[str, str | None]] = {
    "none": ("none", None),
    "self_attention": ("self_attention", None),
    "nmf_one_step": ("nmf", "one_step"),
    "nmf_unroll": ("nmf", "unroll"),
    "vq_one_step": ("vq", "one_step"),
}
ADJOINTS = {"one_step": OneStep, "unroll": Unroll}


@dataclass(frozen=True)
class GanJob:
    """Everything that defines one job (its results file row repeats these fields).

    ``depth`` / ``g_after``: the generator's conv1x1 layers before / after its context block
    (depth without a wider receptive field); ``rank`` / ``ham_steps``: the Hamburger's bases
    and iterations (training and evaluation); ``mismatch_weight``: weight of the
    discriminator's matching-aware negatives (real canvases recombined so that their two
    digits disagree, hinge "fake" on their two digit cells; 0: none); ``d_gate_init``: the
    discriminator's context gate's initial gamma (the generator's starts at 0);
    ``plateau_tolerance``:
    the largest relative FID change over the last ``plateau_window`` of training that counts
    as a plateau; ``network``: the networks' design (``experiments.generation.nets.NETWORK``,
    the only one this code builds; the rows of earlier designs in
    ``docs/generation/history.jsonl`` lack it or name another)."""

    arm: str
    seed: int
    network: str = NETWORK
    steps: int = 12000
    batch_size: int = 32
    noise: int = 32
    g_width: int = 128
    d_width: int = 128
    depth: int = 1
    g_after: int = 2
    mismatch_weight: float = 0.5
    d_gate_init: float = 1.0
    lr_g: float = 1e-4
    lr_d: float = 4e-4
    beta1: float = 0.0
    beta2: float = 0.9
    ema_decay: float = 0.995
    rank: int = 8
    ham_steps: int = 6
    train_size: int = 8192
    val_size: int = 2000
    eval_every: int = 1200
    curve_samples: int = 500
    samples: int = 2000
    gate_every: int = 200
    plateau_window: float = 0.2
    plateau_tolerance: float = 0.05

    def __post_init__(self) -> None:
        if self.arm not in ARMS:
            raise ValueError(f"GanJob: arm must be one of {sorted(ARMS)}, got {self.arm!r}")
        if self.network != NETWORK:
            raise ValueError(
                f"GanJob: this code builds the {NETWORK!r} networks only, got {self.network!r} "
                "(a row of an earlier design: see docs/generation/history.jsonl)"
            )
        if self.steps < 1 or self.eval_every < 1 or self.steps % self.eval_every:
            raise ValueError(
                f"GanJob: steps ({self.steps}) must be a positive multiple of eval_every "
                f"({self.eval_every}), so that the plateau window ends on evaluations"
            )

    @property
    def name(self) -> str:
        """``<arm>_seed<seed>``: the job's key in the results file."""
        return f"{self.arm}_seed{self.seed}"

    def definition(self) -> dict[str, Any]:
        """The fields as a dict (what a finished job is matched against)."""
        return asdict(self)


def build_context(job: GanJob, channels: int) -> torch.nn.Module:
    """The arm's context module on ``channels`` channels (Hamburgers: rank, steps, adjoint)."""
    name, adjoint = ARMS[job.arm]
    if adjoint is None:
        return make_context(name, channels)
    return make_context(
        name,
        channels,
        rank=job.rank,
        steps=job.ham_steps,
        eval_steps=job.ham_steps,
        eval_init="fixed",
        adjoint=ADJOINTS[adjoint](),
    )


def build_networks(job: GanJob) -> tuple[LocalGenerator, LocalDiscriminator]:
    """Generator and discriminator of ``job``, paired by seed (module docstring)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(job.seed + CONTEXT_STREAM)
        g_context, d_context = build_context(job, job.g_width), build_context(job, job.d_width)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(job.seed)
        generator = LocalGenerator(
            g_context, noise=job.noise, width=job.g_width, depth=job.depth, after=job.g_after
        )
        discriminator = LocalDiscriminator(
            d_context, width=job.d_width, gate_init=job.d_gate_init
        )
    return generator, discriminator


def relative_change(curve: list[dict[str, float]], key: str, window: float) -> float:
    """|value at the end - value at (1 - window) of training| / value there, on an eval curve
    (rows with ``step`` and ``key``); the row nearest to the window's start is used."""
    last = curve[-1]
    start_step = last["step"] * (1.0 - window)
    start = min(curve, key=lambda row: abs(row["step"] - start_step))
    return abs(last[key] - start[key]) / abs(start[key])


def peak_rss_mib() -> float:
    """This process's peak resident memory so far, MiB (Linux ``ru_maxrss`` is in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def run_job(job: GanJob, classifier: HalfDigitClassifier, classifier_accuracy: float,
            grid_path: str | None = None) -> dict[str, Any]:  # fmt: skip
    """Train and score ``job``; returns its results row (the definition, final metrics of the
    EMA generator, the eval curve, gamma(t), time per step, peak memory, plateau flag). Writes
    a sample grid to ``grid_path`` when given."""
    rss_start = peak_rss_mib()
    extractor = CanvasFeatures(classifier.eval())
    train_set = FarTwinsDataset("train", job.train_size)
    train, train_labels = to_gan_range(train_set.canvases), train_set.labels
    val = FarTwinsDataset("val", job.val_size)
    real = val.canvases
    real_features = features_of(extractor, real)
    scoring = {"knn_k": 3, "kid_subsets": 50, "kid_subset_size": 500}
    generator, discriminator = build_networks(job)
    betas = (job.beta1, job.beta2)
    opt_g = torch.optim.Adam(generator.parameters(), lr=job.lr_g, betas=betas)
    opt_d = torch.optim.Adam(discriminator.parameters(), lr=job.lr_d, betas=betas)
    ema = AveragedModel(generator, multi_avg_fn=get_ema_multi_avg_fn(job.ema_decay))
    data_rng = torch.Generator().manual_seed(job.seed)
    torch.manual_seed(job.seed)  # the hams' random initial bases during training
    curve: list[dict[str, float]] = []
    gates: list[dict[str, float]] = []
    train_time, skipped = 0.0, 0

    def gate_row(step: int) -> dict[str, float]:
        return {
            "step": step,
            "gamma_g": float(generator.context.gamma.detach()),
            "gamma_d": float(discriminator.context.gamma.detach()),
        }

    gates.append(gate_row(0))
    for step in range(1, job.steps + 1):
        start = time.perf_counter()
        index = torch.randint(len(train), (job.batch_size,), generator=data_rng)
        real_batch = train[index]
        z_d = generator.noise_like(job.batch_size, data_rng)
        z_g = generator.noise_like(job.batch_size, data_rng)
        negatives = mismatched(real_batch, train_labels[index]) if job.mismatch_weight else None
        skipped += _train_step(generator, discriminator, opt_g, opt_d, real_batch, z_d, z_g,
                               negatives, job.mismatch_weight)  # fmt: skip
        ema.update_parameters(generator)
        train_time += time.perf_counter() - start
        if step % job.gate_every == 0:
            gates.append(gate_row(step))
        if step % job.eval_every == 0:
            samples = sample_canvases(_ema_module(ema), job.curve_samples)
            metrics = score(samples, real_features, extractor, **scoring)
            gap = mismatch_gap(discriminator, real, val.labels)
            curve.append({"step": step, **metrics.as_dict(), "d_mismatch_gap": gap})
            logger.info("%s step %d: %s", job.name, step, metrics.as_dict())
    samples = sample_canvases(_ema_module(ema), job.samples)
    final = score(samples, real_features, extractor, **scoring)
    reference_canvases = (train[: job.samples] + 1) / 2
    reference = score(reference_canvases, real_features, extractor, **scoring)
    if grid_path is not None:
        save_grid(samples, grid_path, columns=8)
    change = relative_change(curve, "fid", job.plateau_window)
    return {
        "job": job.name,
        "definition": job.definition(),
        **final.as_dict(),
        "reference": reference.as_dict(),
        "classifier_accuracy": classifier_accuracy,
        "fid_change_last": change,
        "d_mismatch_gap": mismatch_gap(discriminator, real, val.labels),
        "plateau": bool(change < job.plateau_tolerance),
        "time_per_step_s": train_time / job.steps,
        "peak_rss_mib": peak_rss_mib(),
        "rss_before_mib": rss_start,
        "skipped_updates": skipped,
        "params_g": parameter_count(generator),
        "params_d": parameter_count(discriminator),
        "params_context": parameter_count(generator.context)
        + parameter_count(discriminator.context),
        "curve": curve,
        "gates": gates,
    }


def _ema_module(ema: AveragedModel) -> LocalGenerator:
    module = ema.module
    assert isinstance(module, LocalGenerator)
    return module


def _finite_step(loss: Tensor, optimizer: torch.optim.Optimizer) -> int:
    """Back-propagate ``loss`` and step; a non-finite loss or gradient drops the update (1)."""
    optimizer.zero_grad(set_to_none=True)
    if not math.isfinite(float(loss.detach())):
        return 1
    loss.backward()
    grads = [
        p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None
    ]
    if not all(bool(torch.isfinite(g).all()) for g in grads):
        optimizer.zero_grad(set_to_none=True)
        return 1
    optimizer.step()
    return 0


def _train_step(generator: LocalGenerator, discriminator: LocalDiscriminator,
                opt_g: torch.optim.Optimizer, opt_d: torch.optim.Optimizer, real: Tensor,
                z_d: Tensor, z_g: Tensor, negatives: Tensor | None = None,
                weight: float = 0.0) -> int:  # fmt: skip
    """One D update (hinge) on ``real`` (B, 1, 32, 32) and fakes from ``z_d`` (plus, with
    ``negatives`` (M, 1, 32, 32), the hinge "fake" term on their two digit cells times
    ``weight``: matching-aware negatives), then one G update from ``z_g``; returns the number
    of dropped updates (0..2)."""
    with torch.no_grad():
        fake = generator(z_d)
    parts = [real, fake] if negatives is None else [real, fake, negatives]
    logits = discriminator(torch.cat(parts))
    batch = real.shape[0]
    loss = hinge_d_loss(logits[:batch], logits[batch : 2 * batch])
    if negatives is not None and len(negatives):
        left, right = digit_cells(logits[2 * batch :])
        loss = loss + weight * F.relu(1.0 + torch.cat([left, right])).mean()
    dropped = _finite_step(loss, opt_d)
    discriminator.requires_grad_(False)
    try:
        dropped += _finite_step(hinge_g_loss(discriminator(generator(z_g))), opt_g)
    finally:
        discriminator.requires_grad_(True)
    return dropped
