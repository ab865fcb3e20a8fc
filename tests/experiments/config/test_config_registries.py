"""Every parameter of every registered solver, backward mode, linear solver and decomposition is
settable from the command line (nested linear-solver options included), with the library's
default: the configs are generated from the signatures, so they cannot drift."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import OmegaConf

import implicit_ham as ih
from experiments.config.groups import CONTEXT_RUNTIME, register_configs
from experiments.config.signatures import config_class
from experiments.engine.build import build_context
from implicit_ham._core.registry import parameter_names

CONF = Path(__file__).resolve().parents[3] / "conf"
BLOCK = {
    "dual", "compile_block", "version", "ham_channels", "lower_relu", "norm_layer", "act_layer"
}  # the block's options
# A valid value other than the default, for the parameters whose type does not give one.
OTHER_CHOICE = {
    "stop_mode": "abs",
    "on_divergence": "raise",
    "online_update": "train",
    "lower_relu": True,
    "eval_init": "random",
    "singular": "nan",
    "iterative_solver": "cg",
}
# Options the experiments set in conf/ on purpose (the test checks the rest keep the default).
EXPERIMENT_SETTINGS = {("adjoint", "implicit", "max_steps"), ("adjoint", "truncated", "k")}


@pytest.fixture(scope="module", autouse=True)
def _schemas() -> None:
    register_configs()


def _compose(*overrides: str) -> Any:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=list(overrides))


def _other(name: str, default: Any) -> Any:
    """A value of the parameter's type that differs from ``default`` where the type allows."""
    if name in OTHER_CHOICE:
        return OTHER_CHOICE[name]
    if isinstance(default, bool):
        return not default
    if isinstance(default, int):
        return default + 1
    if isinstance(default, float):
        return default / 2 if default else 0.25
    return 0.5 if name in ("inv_t", "tol", "cond_threshold") else 3


def _defaults(cls: type) -> dict[str, Any]:
    if dataclasses.is_dataclass(cls):
        return {f.name: f.default for f in dataclasses.fields(cls) if f.init}
    return {}


def _builtins(registry: Any) -> list[str]:
    """The registry's names, less plug-ins registered by other test modules (they have no
    YAML option in conf/; a plug-in is selected as ``group=base_<name>``)."""
    return [n for n in registry.names() if registry.get(n).__module__.startswith("implicit_ham.")]


def _registered() -> list[tuple[str, str, type]]:
    return [
        *(("solver", name, ih.plugins.SOLVERS.get(name)) for name in _builtins(ih.plugins.SOLVERS)),
        *(
            ("adjoint", name, ih.plugins.ADJOINTS.get(name))
            for name in _builtins(ih.plugins.ADJOINTS)
        ),
    ]


@pytest.mark.parametrize(("group", "name", "cls"), _registered())
def test_every_solver_and_adjoint_parameter_is_settable(group: str, name: str, cls: type) -> None:
    cfg = _compose(f"{group}={name}")
    fields = set(cfg[group]) - {"_target_"}
    assert fields == set(parameter_names(cls))
    for param, default in _defaults(cls).items():
        if (group, name, param) not in EXPERIMENT_SETTINGS and param != "linear_solver":
            assert cfg[group][param] == default, (name, param)
        if param == "linear_solver":
            continue
        value = _other(param, default)
        obj = instantiate(_compose(f"{group}={name}", f"{group}.{param}={value}")[group])
        assert type(obj) is cls and getattr(obj, param) == value, (name, param)


@pytest.mark.parametrize("name", _builtins(ih.plugins.LINEAR_SOLVERS))
def test_every_linear_solver_parameter_is_settable_nested_in_implicit(name: str) -> None:
    cls = ih.plugins.LINEAR_SOLVERS.get(name)
    choose = ["adjoint=implicit", f"adjoint/linear_solver={name}"]
    cfg = _compose(*choose)
    assert set(cfg.adjoint.linear_solver) - {"_target_"} == set(parameter_names(cls))
    assert type(instantiate(cfg.adjoint).linear_solver) is cls
    for param, default in _defaults(cls).items():
        assert cfg.adjoint.linear_solver[param] == default
        value = _other(param, default)
        adjoint = instantiate(_compose(*choose, f"adjoint.linear_solver.{param}={value}").adjoint)
        if param == "iterative_solver":  # Auto's: a name, resolved to the solver it names
            value = ih.plugins.LINEAR_SOLVERS.resolve(value, ih.plugins.LinearSolver)
        assert getattr(adjoint.linear_solver, param) == value, (name, param)


def test_the_implicit_default_linear_solver_is_gmres_with_a_settable_restart() -> None:
    adjoint = instantiate(_compose("adjoint=implicit", "adjoint.linear_solver.restart=40").adjoint)
    assert adjoint.linear_solver == ih.linalg.GMRES(restart=40)


@pytest.mark.parametrize("name", _builtins(ih.plugins.DECOMPOSITIONS))
def test_every_decomposition_parameter_is_settable_in_its_context(name: str) -> None:
    cls = ih.plugins.DECOMPOSITIONS.get(name)
    cfg = _compose(f"context={name}")
    expected = set(parameter_names(cls)) - set(CONTEXT_RUNTIME) | BLOCK
    assert set(cfg.context) - {"_target_", "name"} == expected
    skipped = {"init", "ham_channels", "rank", "norm_layer", "act_layer"}  # layer factories
    values = {p: _other(p, cfg.context[p]) for p in expected - skipped}
    values["rank"] = 4  # small enough for the 16-channel test block
    values["version"] = "v2+"  # the version with dual hams
    if cls.nonnegative:
        values["lower_relu"] = True  # a non-negative ham needs the ReLU
    composed = _compose(f"context={name}", *(f"context.{p}={v}" for p, v in values.items()))
    assert {p: composed.context[p] for p in values} == values
    block = build_context(
        OmegaConf.to_object(composed.context), 16, ih.FixedPointIteration(), ih.OneStep()
    )
    ham = block.ham
    assert isinstance(block, ih.Hamburger) and type(ham) is cls
    assert (ham.rank, ham.groups) == (4, 2)
    assert (ham.steps, ham.eval_steps) == (values["steps"], values["eval_steps"])
    assert ham.eta == values["eta"] and ham.grad_through_bases and ham.use_compile
    assert block.channel_ham is not None  # dual=true
    assert block._compiled_call_impl is not None  # compile_block=true: compiled in place


@pytest.mark.parametrize("name", ["self_attention", "sdpa_attention", "none"])
def test_baseline_contexts_take_their_constructor_options(name: str) -> None:
    cfg = _compose(f"context={name}")
    assert set(cfg.context) - {"_target_", "name"} == set(
        parameter_names(type(ih.make_context(name, 8)))
    ) - {"channels"} | {"compile_block"}


@dataclasses.dataclass(frozen=True)
class Halving(ih.FixedPointIteration):
    """A plug-in solver with one option of its own (importable, as a plug-in must be)."""

    shrink: float = 0.5


def test_a_plugin_registered_before_start_up_is_selectable_as_base_name() -> None:
    ih.plugins.register_solver("test_plugin_halving")(Halving)
    register_configs()
    solver = instantiate(_compose("solver=base_test_plugin_halving", "solver.shrink=0.25").solver)
    assert type(solver) is Halving and solver.shrink == 0.25 and solver.max_steps == 6


def _unresolvable(rank: int = 2, solver: NotImportedAtRunTime = None) -> None:  # noqa: F821
    """A plug-in constructor whose hint names a type imported under TYPE_CHECKING only."""


def test_a_signature_with_an_unresolvable_hint_gives_untyped_fields() -> None:
    conf = config_class(_unresolvable)
    fields = {f.name: f for f in dataclasses.fields(conf)}
    assert fields["rank"].default == 2 and fields["rank"].type is Any
    assert OmegaConf.structured(conf).solver is None
