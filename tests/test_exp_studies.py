"""The no-training studies run end to end on a tiny config and report sane numbers."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from implicit_ham.experiment.schema import register_configs
from implicit_ham.experiment.studies import run_convergence, run_grad_study

CONF = Path(__file__).resolve().parents[1] / "conf"
HAM = ["context.rank=3", "context.steps=3", "context.eval_steps=3"]
TINY = [
    "data.val_size=4",
    "data.train_size=4",
    "data.image_size=32",
    "data.num_classes=3",
    "model.width=16",
    "study.samples=1",
    "study.ks=[1,4]",
    "study.reference_steps=40",
    "study.max_steps=12",
]


def _cfg(*overrides: str) -> dict:
    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=[*TINY, *overrides])
    return OmegaConf.to_container(cfg, resolve=True)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_grad_study_reports_exact_unroll_and_conditioning(tmp_path: Path) -> None:
    results = run_grad_study(_cfg("context=cd", *HAM), tmp_path)
    rows = {row["adjoint"]: row for row in results["fidelity"]}
    assert rows["unroll"]["reference"] is True and rows["unroll"]["cosine"] == pytest.approx(1)
    assert set(rows) >= {"one_step", "implicit", "truncated(k=2)"}
    assert all(-1.0 <= row["cosine"] <= 1.0 + 1e-9 for row in rows.values())
    assert {row["K"] for row in results["grad_vs_k"]} == {1, 4}
    assert [row["point"] for row in results["conditioning"]] == ["K steps", "converged"]
    assert all(math.isfinite(row["spectral_radius"]) for row in results["conditioning"])
    assert (tmp_path / "grad_vs_k.png").exists() and (tmp_path / "results.json").exists()


def test_convergence_study_compares_three_solvers(tmp_path: Path) -> None:
    results = run_convergence(_cfg("context=vq", *HAM), tmp_path)
    assert [row["solver"] for row in results["convergence"]] == [
        "fixed_point",
        "anderson",
        "broyden",
    ]
    assert all(row["steps"] <= 12 for row in results["convergence"])
    assert (tmp_path / "residuals.png").exists()


def test_study_of_a_model_without_decomposition_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no decomposition layer"):
        run_convergence(_cfg("context=sdpa_attention"), tmp_path)
