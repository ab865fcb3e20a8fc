"""Every optimiser and schedule value is checked at start-up (issue 45 item 8): a bad one fails
before the data or the model is built, with an error naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from experiments.config import optim_checks
from experiments.config.groups import TrainConfig, check_components, register_configs
from experiments.config.typed import typed_config
from experiments.engine.run import run_training

CONF = Path(__file__).resolve().parents[3] / "conf"


@pytest.fixture(scope="module", autouse=True)
def _schemas() -> None:
    register_configs()


def _typed(*overrides: str) -> TrainConfig:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return typed_config(compose("config", overrides=list(overrides)), TrainConfig)


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["optim.lr=-1"], "optim.lr"),
        (["optim.lr=0"], "optim.lr"),
        (["optim.lr=nan"], "optim.lr"),
        (["optim.weight_decay=-0.1"], "optim.weight_decay"),
        (["optim=sgd", "optim.lr=-0.5"], "optim.lr"),
        (["optim=sgd", "optim.momentum=1.5"], "optim.momentum"),
        (["optim=sgd", "optim.momentum=-0.1"], "optim.momentum"),
        (["optim=sgd", "optim.weight_decay=-1"], "optim.weight_decay"),
        (["lr_poly_power=-1"], "lr_poly_power"),
        (["lr_poly_power=0"], "lr_poly_power"),
        (["model.arch=serial", "model.backbone_lr_scale=0"], "model.backbone_lr_scale"),
    ],
)
def test_a_bad_optimiser_or_schedule_value_fails_at_start_up_naming_its_key(
    overrides: list[str], key: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config = _typed(*overrides)
    with pytest.raises(ValueError, match=rf"^{key}=.*: must be .*e\.g\. {key}="):
        check_components(config)

    def no_data(*args: object) -> None:
        raise AssertionError("the data was built before the optimiser values were checked")

    monkeypatch.setattr("experiments.engine.run.build_datasets", no_data)
    with pytest.raises(ValueError, match=rf"^{key}="):
        run_training(config, tmp_path / "job")
    assert not (tmp_path / "job" / "results.json").exists()


def test_torchs_own_optimiser_checks_run_at_start_up_too(monkeypatch: pytest.MonkeyPatch) -> None:
    # a value only torch knows the rule of: the optimiser is built once on a stand-in parameter
    monkeypatch.setitem(optim_checks.OPTIM_RULES, "lr", ("anything", lambda v: True, "1"))
    with pytest.raises(ValueError, match=r"^optim: Invalid learning rate: -1.0 .*optim\.\*"):
        check_components(_typed("optim.lr=-1"))


@pytest.mark.parametrize(
    "overrides",
    [[], ["optim=sgd", "optim.momentum=0"], ["lr_poly_power=0.9"],
     ["model.arch=serial", "model.backbone_lr_scale=0.1"]],
)  # fmt: skip
def test_good_values_pass(overrides: list[str]) -> None:
    check_components(_typed(*overrides))
