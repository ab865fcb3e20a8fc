"""The names the study document gives its tasks agree with the presets' configs
(Hydra-composed), so a label cannot drift from the settings it names."""

from __future__ import annotations

from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from experiments.config.groups import register_configs
from experiments.studies.legend_seg.data import PAPER_TASK, STRESS_TASK

CONF = Path(__file__).resolve().parents[3] / "conf"


def _config(*overrides: str) -> dict:
    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=list(overrides))
    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]


def test_the_task_names_are_the_presets_datasets() -> None:
    stress = _config("+experiment=adjoint_ablation")
    paper = _config("+experiment=paper_v4", "+arm=nmf_unroll")
    assert stress["data"]["_target_"].rsplit(".", 1)[-1] == STRESS_TASK
    assert paper["data"]["_target_"].rsplit(".", 1)[-1] == PAPER_TASK


def test_the_one_step_closer_count_separates_ties_from_wins() -> None:
    """The Q2 line counts a (ham, model) case for the one-step only when its cosine beats BPTT's
    by at least 0.001 (the page's three decimals); closer ones are ties, listed apart."""
    from experiments.studies.legend_seg import gradients as sg

    cosines = {("nmf", "init"): (0.9004, 0.9), ("nmf", "trained"): (0.95, 0.9),
               ("vq", "init"): (0.8, 0.9)}  # fmt: skip

    class Runs:
        def study(self, kind: str, point: str, context: str) -> dict[str, object] | None:
            pair = cosines.get((context, point))
            if kind != "grad" or pair is None:
                return None
            k = sg.REFERENCE_K
            return {"grad_vs_k": [{"adjoint": "one_step", "K": k, "cosine": pair[0]},
                                  {"adjoint": "unroll", "K": k, "cosine": pair[1]}]}  # fmt: skip

    closer = sg._closer(Runs())  # type: ignore[arg-type]
    assert closer is not None and closer.pairs == 3
    assert closer.studies == ("nmf (trained)",) and closer.ties == ("nmf (init)",)
