"""The plan of the generation v3 study: arms, seeds, the jobs of each stage and their configs.

Every job is ``conf/config.yaml`` + ``+experiment=generation_v3`` + ``+arm=<arm>`` + its seed
(``seed``, ``data.seed`` and ``model.init_seed`` all set to it: arms of one seed see the same
canvases in the same batches and start from the same shared weights,
``experiments.models.masked_cell``) + the Hamburger's rank and steps for decomposition arms.
The pilot stage runs no context and self-attention over ``pilot_seeds``; the main stage every
arm over ``seeds`` (the pilot's jobs are among them and are not run twice). The pairing stage
trains every arm's pairing classifier (``+experiment=generation_v3_pairing``: real far-twin
canvases vs recombined ones, ``experiments.models.masked_cell.CellPairingClassifier``) over
``pairing_seeds``, paired by seed in the same way.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field

# study arm -> (conf/arm file, HamGAN-style label on the page)
ARMS: dict[str, tuple[str, str]] = {
    "none": ("none", "no context"),
    "self_attention": ("self_attention", "self-attention (SAGAN)"),
    "nmf_one_step": ("nmf_one_step", "Hamburger NMF, one-step gradient (HamGAN)"),
    "nmf_unroll": ("nmf_unroll", "Hamburger NMF, BPTT"),
    "nmf_implicit": ("nmf_implicit", "Hamburger NMF, implicit gradient"),
    "vq_one_step": ("vq_one_step", "Hamburger VQ, one-step gradient"),
}
BASELINES = ("none", "self_attention")
PILOT_ARMS = ("none", "self_attention")


@dataclass(frozen=True)
class Job:
    """One training job: an arm at a seed."""

    arm: str
    seed: int

    @property
    def key(self) -> str:
        """The job's directory name and row key."""
        return f"{self.arm}-s{self.seed}"


@dataclass(frozen=True)
class Plan:
    """The study's settings (``digest`` names them in every row).

    Attributes:
        seeds: the main sweep's seeds (>= 6). pilot_seeds: the gate's (>= 3, a prefix of seeds).
        epochs: training epochs of every job (64 steps each at the preset's 4096 canvases,
            batch 64). rank / ham_steps: the Hamburger's bases and solver iterations.
        plateau_share / plateau_tol: a job is at a plateau when its val loss changed by less
            than ``plateau_tol`` (relative) over the last ``plateau_share`` of its epochs.
        overrides: extra Hydra overrides of every job (tests shrink the jobs with them).
        pairing_seeds / pairing_epochs: the pairing stage's seeds (>= 8) and epochs (64 steps
            each at the preset's 4096 canvases; a self-attention job of seed 0 stayed at
            chance for 37 epochs, reached 0.71 at 40 and 0.89 at 120).
    """

    seeds: tuple[int, ...] = (0, 1, 2, 3, 4, 5)
    pilot_seeds: tuple[int, ...] = (0, 1, 2)
    epochs: int = 40
    rank: int = 8
    ham_steps: int = 6
    plateau_share: float = 0.2
    plateau_tol: float = 0.02
    arms: tuple[str, ...] = tuple(ARMS)
    overrides: tuple[str, ...] = field(default_factory=tuple)
    pairing_seeds: tuple[int, ...] = tuple(range(8))
    pairing_epochs: int = 120

    def __post_init__(self) -> None:
        unknown = sorted(set(self.arms) - set(ARMS))
        if unknown:
            raise ValueError(f"Plan: unknown arm(s) {unknown}; valid: {sorted(ARMS)}")
        if not set(PILOT_ARMS) <= set(self.arms):
            raise ValueError(f"Plan: arms must include the pilot's {PILOT_ARMS}, got {self.arms}")
        if self.pilot_seeds != self.seeds[: len(self.pilot_seeds)]:
            raise ValueError(
                f"Plan: pilot_seeds {self.pilot_seeds} must be the first seeds of {self.seeds}"
            )

    def digest(self) -> str:
        """Short hash of the settings that change a job's result."""
        keys = ("epochs", "rank", "ham_steps", "overrides")
        payload = json.dumps({k: asdict(self)[k] for k in keys}, sort_keys=True, default=list)
        return hashlib.sha256(payload.encode()).hexdigest()[:12]

    def pairing_digest(self) -> str:
        """Short hash of the settings that change a pairing job's result."""
        keys = ("pairing_epochs", "rank", "ham_steps", "overrides")
        payload = json.dumps({k: asdict(self)[k] for k in keys}, sort_keys=True, default=list)
        return hashlib.sha256(("pairing" + payload).encode()).hexdigest()[:12]

    def pilot_jobs(self) -> list[Job]:
        """The gate's jobs, seeds outer (every pilot arm has seed 0 before any has seed 1)."""
        return [Job(arm, seed) for seed in self.pilot_seeds for arm in PILOT_ARMS]

    def main_jobs(self) -> list[Job]:
        """Every arm at every seed, seeds outer."""
        return [Job(arm, seed) for seed in self.seeds for arm in self.arms]

    def pairing_jobs(self) -> list[Job]:
        """The pairing classifier of every arm at every pairing seed, seeds outer."""
        return [Job(arm, seed) for seed in self.pairing_seeds for arm in self.arms]


def job_overrides(job: Job, plan: Plan, pairing: bool = False) -> list[str]:
    """The Hydra overrides that make ``job`` out of the generation_v3 preset (the pairing
    check's, ``generation_v3_pairing``, when ``pairing``) and its arm."""
    preset, epochs = ("generation_v3_pairing", plan.pairing_epochs) if pairing else (
        "generation_v3", plan.epochs)  # fmt: skip
    overrides = [
        f"+experiment={preset}",
        f"+arm={ARMS[job.arm][0]}",
        f"seed={job.seed}",
        f"data.seed={job.seed}",
        f"model.init_seed={job.seed}",
        f"epochs={epochs}",
    ]
    if job.arm not in BASELINES:
        overrides += [
            f"context.rank={plan.rank}",
            f"context.steps={plan.ham_steps}",
            f"context.eval_steps={plan.ham_steps}",
        ]
    return overrides + list(plan.overrides)
