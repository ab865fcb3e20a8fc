"""The typed run configuration: every option of every config group composes into the schema's
dataclasses (``typed_config``), its nodes stay instantiable into the same library objects as the
composed ``DictConfig``, and ``as_container`` gives back exactly the dict the files held before
(``OmegaConf.to_container(cfg, resolve=True)``), so resume comparisons against old checkpoints
still match."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue

from experiments.config.groups import (
    DiagnosticsConf,
    ModelConf,
    TrainConfig,
    check_train_config,
    config_groups,
    register_configs,
)
from experiments.config.typed import ContextConf, OptimConf, TargetConf, as_container, typed_config
from experiments.engine.resume import comparable_config, config_differences

CONF = Path(__file__).resolve().parents[3] / "conf"
BASES = {"context": ContextConf, "optim": OptimConf, "diagnostics": DiagnosticsConf}
NEEDS_ROOT = ("cifar10", "voc2012")  # their data.root has no default


@pytest.fixture(scope="module", autouse=True)
def _schemas() -> None:
    register_configs()


def _compose(name: str, *overrides: str) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(name, overrides=list(overrides))


def _yaml_options() -> list[tuple[str, str]]:
    """(group, option) of every YAML file of the train groups."""
    return [
        (group, path.stem)
        for group in config_groups()
        for path in sorted((CONF / group).glob("*.yaml"))
    ]


def _overrides(group: str, option: str) -> list[str]:
    if group == "adjoint/linear_solver":
        return ["adjoint=implicit", f"adjoint/linear_solver={option}"]
    extra = ["data.root=/nonexistent"] if group == "data" and option in NEEDS_ROOT else []
    return [f"{group}={option}", *extra]


def _node(cfg: object, group: str) -> object:
    for part in group.split("/"):
        cfg = getattr(cfg, part)
    return cfg


@pytest.mark.parametrize(("group", "option"), _yaml_options())
def test_every_group_option_becomes_a_typed_node_with_the_same_content(
    group: str, option: str
) -> None:
    cfg = _compose("config", *_overrides(group, option))
    typed = typed_config(cfg, TrainConfig)
    node = _node(typed, group)
    assert isinstance(typed, TrainConfig) and isinstance(typed.model, ModelConf)
    base = BASES.get(group, TargetConf)
    assert isinstance(node, base), (type(node), base)
    schema = "default" if group == "diagnostics" else option
    assert type(node).__name__ == config_groups()[group][schema].__name__
    assert as_container(typed) == OmegaConf.to_container(cfg, resolve=True)


@pytest.mark.parametrize("group", ["solver", "adjoint", "adjoint/linear_solver"])
def test_typed_nodes_instantiate_the_objects_the_composed_config_does(group: str) -> None:
    options = sorted(p.stem for p in (CONF / group).glob("*.yaml"))
    for option in options:
        overrides = _overrides(group, option)
        if group == "solver":
            overrides.append("solver.max_steps=9")  # a value that is not the default
        cfg = _compose("config", *overrides)
        typed = typed_config(cfg, TrainConfig)
        ours, reference = instantiate(_node(typed, group)), instantiate(_node(cfg, group))
        assert type(ours) is type(reference)
        assert repr(ours) == repr(reference) and " at 0x" not in repr(ours)
        if group == "solver":
            assert ours.max_steps == 9


def test_a_typed_config_built_by_hand_is_checked_like_a_composed_one() -> None:
    typed = typed_config(_compose("config"), TrainConfig)
    check_train_config(typed)
    with pytest.raises(ValueError, match="batch_size=0: must be an integer >= 1"):
        check_train_config(dataclasses.replace(typed, batch_size=0))
    with pytest.raises(ValueError, match="epochs=True"):
        check_train_config(dataclasses.replace(typed, epochs=True))


def test_a_config_of_another_schema_is_refused_naming_both() -> None:
    with pytest.raises(TypeError, match="TrainConfig, not a ModelConf"):
        typed_config(_compose("config"), ModelConf)


def test_an_unset_mandatory_value_fails_at_conversion() -> None:
    with pytest.raises(MissingMandatoryValue, match="root"):
        typed_config(_compose("config", "data=cifar10"), TrainConfig)


def test_the_typed_config_matches_checkpoints_of_the_untyped_one() -> None:
    """A checkpoint stores ``comparable_config`` of the config as plain data: what the typed
    config gives must compare equal to what the composed config gave, and differ where the
    runs differ."""
    cfg = _compose("config", "context=vq", "optim.lr=0.01")
    stored = comparable_config(OmegaConf.to_container(cfg, resolve=True))
    typed = typed_config(cfg, TrainConfig)
    assert config_differences(stored, comparable_config(as_container(typed))) == []
    other = dataclasses.replace(typed, optim=dataclasses.replace(typed.optim, lr=0.02))
    assert config_differences(stored, comparable_config(as_container(other))) == ["optim.lr"]
