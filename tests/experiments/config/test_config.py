"""Hydra config tree: every group option composes against its schema and builds; typos fail."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException, MissingConfigException
from hydra.utils import instantiate
from omegaconf import OmegaConf
from omegaconf.errors import MissingMandatoryValue

import implicit_ham as ih
from experiments.config.groups import (
    TrainConfig,
    check_components,
    config_groups,
    register_configs,
)
from experiments.config.typed import typed_config
from experiments.engine.build import build_context, build_datasets, build_sinks, context_channels
from experiments.engine.run import run_training
from implicit_ham.nn import decomposition_of

CONF = Path(__file__).resolve().parents[3] / "conf"


@pytest.fixture(scope="module", autouse=True)
def _schemas() -> None:
    register_configs()


def _compose(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=list(overrides))


def _typed(*overrides: str) -> TrainConfig:
    return typed_config(_compose(*overrides), TrainConfig)


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def _builtin(group: str, option: str) -> bool:
    """Not a plug-in that another test registered (nor a plug-in's token mixer)."""
    if group == "context":
        option = decomposition_of(option) or option
    registry = {
        "context": ih.plugins.DECOMPOSITIONS,
        "adjoint": ih.plugins.ADJOINTS,
        "solver": ih.plugins.SOLVERS,
        "adjoint/linear_solver": ih.plugins.LINEAR_SOLVERS,
    }.get(group)
    if registry is None or option not in registry.names():
        return True
    return registry.get(option).__module__.startswith("implicit_ham.")


def test_every_schema_option_has_a_yaml_file_and_back() -> None:
    for group, options in config_groups().items():
        yaml_options = set(_options(group)) - {"off"}
        assert yaml_options == {o for o in options if _builtin(group, o)}, group


ADJOINT_CLASSES = {"unroll": ih.Unroll, "one_step": ih.OneStep, "truncated": ih.Truncated,
                   "phantom": ih.Phantom, "neumann": ih.Neumann, "implicit": ih.Implicit}


@pytest.mark.parametrize("option", sorted(ADJOINT_CLASSES))
def test_adjoint_options_instantiate_library_objects(option: str) -> None:
    cfg = _compose(f"adjoint={option}")
    assert type(instantiate(cfg.adjoint)) is ADJOINT_CLASSES[option]


@pytest.mark.parametrize("option,cls", [("fixed_point", ih.FixedPointIteration),
                                        ("anderson", ih.Anderson), ("broyden", ih.Broyden)])
def test_solver_options_instantiate_library_objects(option: str, cls: type) -> None:
    assert type(instantiate(_compose(f"solver={option}").solver)) is cls


@pytest.mark.parametrize("option", ["nmf", "vq", "cd", "svd", "self_attention",
                                    "sdpa_attention", "none"])
def test_context_options_build_a_shape_preserving_module(option: str) -> None:
    cfg = _typed(f"context={option}", "context.rank=4" if option in
                 ("nmf", "vq", "cd", "svd") else "seed=0")
    context = build_context(cfg.context, 16, ih.FixedPointIteration(), ih.OneStep())
    x = torch.rand(2, 16, 8, 8)
    assert context(x).shape == x.shape


@pytest.mark.parametrize("option", ["nmf_mixer", "vq_mixer", "cd_mixer", "sdpa_mixer",
                                    "linear_attention_mixer"])
def test_token_mixer_options_build_a_mixer_with_the_runs_adjoint(option: str) -> None:
    ham = decomposition_of(option) is not None
    cfg = _typed(f"context={option}", "context.rank=4" if ham else "context.heads=2")
    context = build_context(cfg.context, 16, ih.FixedPointIteration(), ih.Unroll())
    x = torch.randn(2, 9, 16)
    assert context(x).shape == x.shape
    if ham:
        assert isinstance(context, ih.HamMixer) and context.ham.rank == 4
        assert isinstance(context.ham.adjoint, ih.Unroll)  # the run's backward mode reaches it
    else:
        assert context.heads == 2


def test_builtin_data_options_build_their_splits() -> None:
    cfg = _compose("data.train_size=6", "data.val_size=3", "data.image_size=48")
    train, val, task = build_datasets(typed_config(cfg, TrainConfig).data)
    image, mask = train[0]
    assert (len(train), len(val)) == (6, 3)
    assert image.shape == (3, 48, 48) and mask.shape == (48, 48)
    assert task.kind == "segmentation" and task.num_classes == cfg.data.num_classes + 1
    train, val, task = build_datasets(_typed("data=digits").data)
    assert task.kind == "classification" and len(train) + len(val) == 1797


def test_logger_options_build_their_sinks(tmp_path: Path) -> None:
    def sinks(option: str) -> list[str]:
        cfg = _typed(f"logger={option}").logger
        return [type(s).__name__ for s in build_sinks(cfg, tmp_path, {"seed": 0})]

    assert sinks("files") == ["JSONLSink", "CSVSink"]
    assert sinks("none") == []


def test_diagnostics_off_disables_the_callback() -> None:
    assert _compose("diagnostics=default").diagnostics.enabled
    assert not _compose("diagnostics=off").diagnostics.enabled


def test_optimiser_config_is_a_partial_over_parameters() -> None:
    cfg = _compose("optim=sgd", "optim.lr=0.5")
    optimizer = instantiate(cfg.optim)([torch.nn.Parameter(torch.zeros(2))])
    assert isinstance(optimizer, torch.optim.SGD) and optimizer.defaults["lr"] == 0.5


@pytest.mark.parametrize("preset", ["demo", "adjoint_ablation", "attention_vs_md",
                                    "optuna_search", "study_remedy", "study_ridge", "legend_probe",
                                    "paper_v4"])
def test_experiment_presets_compose(preset: str) -> None:
    config = _typed(f"+experiment={preset}")  # every key known to its schema
    check_components(config)  # and every value accepted by the library
    assert config.epochs > 0


@pytest.mark.parametrize(
    "overrides",
    [
        ["+experiment=adjoint_ablation", "context=vq", "adjoint=phantom", "context.steps=12"],
        ["+experiment=attention_vs_md", "+arm=sdpa_matched"],
        ["+experiment=attention_vs_md", "+arm=self_attention_matched"],
        ["+experiment=attention_vs_md", "+arm=none"],
        ["+experiment=study_remedy", "context=nmf_normalized", "adjoint.ridge=0.1"],
        ["+experiment=study_ridge", "context=nmf_ridge", "adjoint=implicit"],
        ["+experiment=study_ridge", "context=cd_ridge", "adjoint=unroll"],
    ],
)
def test_every_study_job_composes_at_the_study_scale(overrides: list[str]) -> None:
    """Each kind of job experiments/scripts/study.sh launches, as its sweep composes it."""
    cfg = _compose(*overrides)
    check_components(typed_config(cfg, TrainConfig))  # known keys, values the library accepts
    assert (cfg.epochs, cfg.batch_size, cfg.data.train_size, cfg.threads) == (12, 16, 512, 1)
    if "eval_steps" in cfg.context:
        assert cfg.context.eval_steps == cfg.context.steps


@pytest.mark.parametrize(
    ("launcher", "target"), [("local2", "JoblibLauncher"), ("cluster", "SlurmLauncher")]
)
def test_study_presets_run_locally_or_on_a_cluster(launcher: str, target: str) -> None:
    overrides = ["+experiment=adjoint_ablation"] + (
        [] if launcher == "local2" else ["hydra/launcher=cluster"]
    )
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=overrides, return_hydra_config=True)
    assert cfg.hydra.launcher._target_.endswith(target)
    assert launcher != "local2" or cfg.hydra.launcher.n_jobs == 2


def test_matched_attention_arms_have_the_hamburger_parameter_count() -> None:
    """The claim of conf/arm/*_matched.yaml: within 1 % of the Hamburger block's parameters."""
    counts = {}
    for arm in ("sdpa_matched", "self_attention_matched", "nmf_unroll"):
        cfg = _typed(f"+arm={arm}", "data.train_size=4", "data.val_size=4")
        _, _, info = build_datasets(cfg.data)
        module = build_context(cfg.context, context_channels(info, cfg.model), None, None)
        counts[arm] = sum(p.numel() for p in module.parameters())
    assert counts["sdpa_matched"] == counts["self_attention_matched"]
    assert counts["sdpa_matched"] == pytest.approx(counts["nmf_unroll"], rel=0.01)


def test_matched32_attention_arms_have_the_serial_hamburger_parameter_count() -> None:
    """The claim of conf/arm/*_matched32.yaml: within 1 % of the Hamburger block on the
    serial segmenter's 32 context channels."""
    counts = {}
    for arm in ("sdpa_matched32", "self_attention_matched32", "nmf_unroll"):
        cfg = _typed("+experiment=paper_v4", f"+arm={arm}")
        module = build_context(cfg.context, 32, ih.FixedPointIteration(), ih.OneStep())
        counts[arm] = sum(p.numel() for p in module.parameters())
    for arm in ("sdpa_matched32", "self_attention_matched32"):
        assert abs(counts[arm] - counts["nmf_unroll"]) <= 0.01 * counts["nmf_unroll"]


def test_arms_override_context_and_adjoint() -> None:
    cfg = _compose("+arm=cd_implicit")
    assert cfg.context.name == "cd" and cfg.adjoint._target_ == "implicit_ham.Implicit"


def test_unknown_group_option_lists_the_choices() -> None:
    with pytest.raises(MissingConfigException, match="implicit"):
        _compose("adjoint=implicitt")


def test_misspelt_key_fails_at_composition() -> None:
    with pytest.raises(ConfigCompositionException, match="tl"):
        _compose("adjoint=implicit", "adjoint.tl=3")


@pytest.mark.parametrize("arm", _options("arm"))
def test_every_arm_passes_the_start_up_checks(arm: str) -> None:
    # no false positive of the key and value checks on the arms the sweeps use, each with the
    # preset it runs under (the baselines under the attention study's)
    baseline = arm in ("none", "gap") or "attention" in arm or arm.startswith("sdpa")
    preset = "attention_vs_md" if baseline else "adjoint_ablation"
    check_components(_typed(f"+experiment={preset}", f"+arm={arm}"))


def test_a_key_added_with_plus_is_refused_not_silently_ignored() -> None:
    # Hydra refuses context.stpes=3 but suggests +context.stpes=3, which it then accepts: the
    # run would train with the default steps while the user reads K = 3
    with pytest.raises(ValueError, match=r"context\.stpes \(did you mean context\.steps\?\)"):
        _typed("+context.stpes=3")
    with pytest.raises(ValueError, match=r"optim\.lrr \(did you mean optim\.lr\?\)"):
        _typed("+optim.lrr=0.1")
    assert _typed("context.steps=3").context.steps == 3


@pytest.mark.parametrize(
    ("overrides", "group"),
    [
        (["context.steps=-1"], "context"),
        (["context.eval_steps=-2"], "context"),
        (["adjoint=truncated", "adjoint.k=0"], "adjoint"),
        (["solver.max_steps=-1"], "solver"),  # 0 is FixedPointIteration's default budget
    ],
)
def test_a_value_the_library_refuses_fails_at_start_up_naming_its_group(
    overrides: list[str], group: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config = _typed(*overrides)
    with pytest.raises(ValueError, match=rf"^{group}: .*the {group}\.\* config options"):
        check_components(config)

    def no_data(*args: object) -> None:
        raise AssertionError("the data was built before the config was checked")

    monkeypatch.setattr("experiments.engine.run.build_datasets", no_data)
    with pytest.raises(ValueError, match=rf"^{group}: "):
        run_training(config, tmp_path / "job")


def test_key_of_another_option_fails_at_composition() -> None:
    with pytest.raises(ConfigCompositionException, match="rank"):
        _compose("context=self_attention", "context.rank=4")


def test_wrong_type_fails_at_composition() -> None:
    with pytest.raises(ConfigCompositionException):
        _compose("epochs=many")


def test_wrong_type_of_an_optional_generated_field_fails_at_composition() -> None:
    """``tol: float | None`` in the library's signature is ``Optional[float]`` in the config."""
    assert _compose("solver.tol=null").solver.tol is None
    with pytest.raises(ConfigCompositionException, match="tol"):
        _compose("solver.tol=abc")


def test_misspelt_root_key_fails() -> None:
    with pytest.raises(ConfigCompositionException, match="epoch"):
        _compose("epoch=3")


def test_missing_data_root_is_reported_on_access() -> None:
    cfg = _compose("data=cifar10")
    with pytest.raises(MissingMandatoryValue, match="root"):
        OmegaConf.to_container(cfg.data, throw_on_missing=True)


def test_bad_data_root_is_a_clear_error_with_the_expected_layout(tmp_path: Path) -> None:
    from experiments.data import DataLayoutError
    from experiments.engine.build import build_datasets

    cfg = _typed("data=cifar10", f"data.root={tmp_path / 'nowhere'}")
    with pytest.raises(DataLayoutError, match="data_batch_1"):
        build_datasets(cfg.data)


def test_zero_epochs_is_refused_at_start_up_before_any_result_is_written(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "experiments.train", "epochs=0", f"hydra.run.dir={tmp_path}"],
        capture_output=True,
        text=True,
        cwd=CONF.parent,
    )
    assert run.returncode != 0
    assert "epochs=0: must be an integer >= 1" in run.stderr
    assert not (tmp_path / "results.json").exists()


def test_run_training_refuses_zero_epochs_too(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="epochs=0"):
        run_training(_typed("epochs=0"), tmp_path)
