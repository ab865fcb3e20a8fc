"""A job of study v4 and the names its keys use: the hams, the gradients, the regime.

A ``Job`` is one training run (or, with ``stage == "pretrain"``, one backbone's pretraining);
its ``key`` names the CSV row and the job's folder. The key format is study v3's, so the rows
of both studies read alike (``docs/results/paper_v3.csv``, which the v4 page quotes).
"""

from __future__ import annotations

from dataclasses import dataclass

HAMS = ("nmf", "vq", "cd")
ONE_STEP, THROUGH_BASES, BPTT, NO_GRADIENT = "one_step", "one_step_bases", "bptt", "-"
REGIME = "finetune"


@dataclass(frozen=True)
class Job:
    """One training job (or, with ``stage == "pretrain"``, one pretraining run)."""

    stage: str
    context: str
    gradient: str
    K: int
    inv_t: float | None
    lr: float | None
    replicate: int
    epochs: int

    @property
    def key(self) -> str:
        """The job's identity (its CSV row and its folder); the stage is not part of it."""
        if self.stage == "pretrain":
            return f"pretrain-r{self.replicate}"
        inv_t = "-" if self.inv_t is None else f"{self.inv_t:g}"
        return (
            f"{self.context}-{self.gradient}-K{self.K}-t{inv_t}-lr{self.lr:g}"
            f"-r{self.replicate}-e{self.epochs}"
        )
