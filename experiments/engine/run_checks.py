"""Start-up checks of ``experiments.train``'s run settings (``log_every``, ``reliability.*``):
every value is refused with a clear error before the job takes its directory's lock or writes a
file, so a refused command leaves the directory (perhaps another run's) untouched."""

from __future__ import annotations

from experiments.config.groups import TrainConfig
from experiments.engine.preemption import parse_signals
from experiments.engine.resume import THREADS_CHANGES, WORLD_SIZE_CHANGES
from implicit_ham.plugins import check_choice, check_positive_int, check_tolerance
from implicit_ham.reliability.divergence import LossDivergence
from implicit_ham.reliability.failures import check_policy


def check_run_settings(cfg: TrainConfig) -> None:
    """ValueError naming the first refused value of ``log_every`` and ``reliability``."""
    check_positive_int("config", "log_every", cfg.log_every)
    rel = cfg.reliability
    check_policy(rel.on_failure)
    for name, minimum in (
        ("checkpoint_every", 0),
        ("keep", 1),
        ("warn_first", 0),
        ("warn_every", 1),
        ("max_consecutive_skips", 0),
        ("max_skips", 0),
    ):
        check_positive_int("reliability", name, getattr(rel, name), minimum)
    check_tolerance("reliability", "dist_timeout_s", rel.dist_timeout_s)
    check_choice("reliability", "world_size_change", rel.world_size_change, WORLD_SIZE_CHANGES)
    check_choice("reliability", "threads_change", rel.threads_change, THREADS_CHANGES)
    parse_signals(rel.preempt_signals)
    check_positive_int("reliability", "divergence_steps", rel.divergence_steps, 0)
    if rel.divergence_steps:
        LossDivergence(rel.divergence_factor, rel.divergence_steps)  # its own checks
