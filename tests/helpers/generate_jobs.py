"""Real ``python -m experiments.generate`` subprocesses at a tiny scale: the command line, an
untrained digit classifier for the metrics' cache (training one takes a minute; the metrics'
maths is tested elsewhere), and the parts of a job's files that must agree between two runs
(everything but timings)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
from helpers.train_jobs import ROOT, train_env, untimed

from experiments.engine.checkpoint import read_checkpoint, write_checkpoint
from experiments.generation.classifier import CLASSIFIER_VERSION
from experiments.models.digit_classifier import HalfDigitClassifier


def tiny_generate(steps: int, eval_every: int, checkpoint_every: int) -> list[str]:
    """Overrides of a tiny GAN job (4 canvases a step, ~20 ms a step on one thread)."""
    return [
        "+arm=nmf_one_step", "context.rank=2", "context.steps=2", "context.eval_steps=2",
        f"steps={steps}", "batch_size=4", "log_every=1", "gan.z_dim=8", "gan.g_width=8",
        "gan.d_width=8", "canvas.train_size=16", "canvas.val_size=12", "metrics.samples=10",
        "metrics.curve_samples=6", f"metrics.eval_every={eval_every}", "metrics.knn_k=2",
        "metrics.kid_subsets=2", "metrics.kid_subset_size=4", "metrics.classifier_epochs=1",
        "metrics.min_classifier_accuracy=0.0", "metrics.grid=3",
        f"reliability.checkpoint_every={checkpoint_every}",
    ]  # fmt: skip


# the command tests' job: 20 steps, a checkpoint every 7 steps and at the end
TINY_STEPS = 20
TINY_GENERATE = tiny_generate(TINY_STEPS, eval_every=10, checkpoint_every=7)


def write_untrained_classifier(path: Path) -> Path:
    """An untrained classifier saved as the metrics' cache for ``TINY_GENERATE``'s settings
    (a job uses ``classifier.pt`` beside its directory by default)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = HalfDigitClassifier().eval()
    settings = {"version": CLASSIFIER_VERSION, "epochs": 1, "val_fraction": 0.2, "seed": 0}
    write_checkpoint(path, {"model": model.state_dict(), "accuracy": 0.1, "settings": settings})
    return path


def generate_command(job: Path, *extra: str) -> list[str]:
    """The command line of one tiny generation job in ``job``."""
    return [sys.executable, "-m", "experiments.generate", *TINY_GENERATE, *extra,
            f"hydra.run.dir={job}"]  # fmt: skip


def run_generate(job: Path, *extra: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run the job to its end (bounded by ``timeout`` seconds)."""
    return subprocess.run(generate_command(job, *extra), cwd=ROOT, env=train_env(),
                          capture_output=True, text=True, timeout=timeout, check=False)  # fmt: skip


def start_generate(job: Path, *extra: str) -> subprocess.Popen[str]:
    """Start the job without waiting; stdout and stderr merged into ``proc.stdout``."""
    command = generate_command(job, *extra)
    return subprocess.Popen(command, cwd=ROOT, env=train_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # fmt: skip


def step_rows(job: Path) -> int:
    """Rows of ``metrics.jsonl`` holding a discriminator loss (one per logged step)."""
    metrics = job / "metrics.jsonl"
    return metrics.read_text().count('"loss/d"') if metrics.exists() else 0


def assert_same_generation(job: Path, reference: Path, why: str = "") -> None:
    """The job ended exactly like ``reference``: results (metrics, failures, steps, gates,
    reference scores), metric rows, and the generator's, discriminator's and EMA generator's
    weights bit for bit (timings excluded)."""
    ours = json.loads((job / "results.json").read_text())
    theirs = json.loads((reference / "results.json").read_text())
    assert ours["status"] == "ok", f"{why}: {ours.get('error')}"
    for key in ("metrics", "failures", "steps", "gates", "reference"):
        assert untimed(ours[key]) == untimed(theirs[key]), f"{why}: {key}"
    assert _rows(job) == _rows(reference), f"{why}: metric rows"
    a, b = read_checkpoint(job / "checkpoint.pt"), read_checkpoint(reference / "checkpoint.pt")
    for net in ("G", "D", "G_ema"):
        assert a[net].keys() == b[net].keys(), f"{why}: {net}"
        for name, tensor in a[net].items():
            assert torch.equal(tensor, b[net][name]), f"{why}: {net}.{name}"


def _rows(job: Path) -> list[dict[str, Any]]:
    return [untimed(json.loads(line)) for line in (job / "metrics.jsonl").read_text().splitlines()]
