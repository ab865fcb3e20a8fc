"""The argmin hams' sweep arms compose and build (the experiments' side of RidgeNMF)."""

from __future__ import annotations

from pathlib import Path

import torch

import implicit_ham as ih


def test_the_sweep_arms_compose_and_build_the_ham() -> None:
    """``context=nmf_ridge`` and the arms ``nmf_ridge_{implicit,one_step,unroll}`` (e.g.
    ``+experiment=adjoint_ablation context=nmf_ridge``) build a shape-preserving block."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from experiments.config.groups import register_configs
    from experiments.engine.build import build_context

    register_configs()
    conf = str(Path(__file__).resolve().parents[3] / "conf")
    for arm in ("nmf_ridge_implicit", "nmf_ridge_one_step", "nmf_ridge_unroll"):
        with initialize_config_dir(config_dir=conf, version_base="1.3"):
            cfg = compose("config", overrides=[f"+arm={arm}", "context.rank=4", "context.lam=0.2"])
        adjoint = ih.plugins.make_adjoint(arm.removeprefix("nmf_ridge_"))
        block = build_context(
            OmegaConf.to_object(cfg.context), 16, ih.FixedPointIteration(), adjoint
        )
        x = torch.rand(2, 16, 8, 8)
        assert block(x).shape == x.shape
        assert any(isinstance(m, ih.RidgeNMF) and m.lam == 0.2 for m in block.modules())
