"""Experiment jobs behind the Hydra entry points in ``experiments/`` (usable without Hydra)."""

from .results import read_results, write_results
from .train import run_training, seed_everything

__all__ = ["read_results", "run_training", "seed_everything", "write_results"]
