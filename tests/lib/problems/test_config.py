"""Solvers and backward modes as configuration: frozen dataclasses built from keyword arguments,
by registry name, by Hydra ``_target_``; user-registered backward modes."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import implicit_ham as ih
from implicit_ham.solvers.base import FixedPointSolver

NEEDS_HYDRA = "Hydra / OmegaConf come with the experiments extra (the library needs neither)"
CONFIGURABLE = [
    (ih.FixedPointIteration, {"max_steps": 3, "tol": 1e-4, "damping": 0.5, "stop_mode": "abs"}),
    (ih.Anderson, {"max_steps": 20, "tol": 1e-6, "m": 3, "lam": 1e-6}),
    (ih.Broyden, {"max_steps": 20, "tol": 1e-6}),
    (ih.Unroll, {}),
    (ih.Truncated, {"k": 2}),
    (ih.OneStep, {}),
    (ih.Phantom, {"k": 3, "tau": 0.25}),
    (ih.Neumann, {"k": 4, "tau": 0.75}),
    (ih.Implicit, {"max_steps": 30, "tol": 1e-7, "on_divergence": "raise"}),
    (ih.linalg.GMRES, {"restart": 5}),
    (ih.linalg.Dense, {"max_size": 64}),
    (ih.linalg.AndersonSolve, {"m": 4}),
]


@pytest.mark.parametrize(("cls", "kwargs"), CONFIGURABLE, ids=lambda v: getattr(v, "__name__", ""))
def test_configurable_objects_are_frozen_dataclasses_built_from_keywords(cls, kwargs) -> None:
    obj = cls(**kwargs)
    assert dataclasses.is_dataclass(obj)
    for key, value in kwargs.items():
        assert getattr(obj, key) == value
    field = dataclasses.fields(obj)[0].name if dataclasses.fields(obj) else "anything"
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(obj, field, None)
    assert cls(**kwargs) == obj and hash(cls(**kwargs)) == hash(obj)


def test_make_solver_by_name_with_options() -> None:
    solver = ih.plugins.make_solver("anderson", m=3)
    assert solver == ih.Anderson(m=3)
    assert solver.name == "anderson"
    assert ih.plugins.make_adjoint("phantom", k=2, tau=0.5) == ih.Phantom(k=2, tau=0.5)
    assert ih.plugins.make_linear_solver("gmres", restart=7) == ih.linalg.GMRES(restart=7)


def test_implicit_resolves_a_linear_solver_name_to_an_instance() -> None:
    assert ih.Implicit(linear_solver="dense") == ih.Implicit(linear_solver=ih.linalg.Dense())
    default = ih.Implicit().linear_solver
    assert isinstance(default, ih.linalg.Auto)
    assert isinstance(default.iterative_solver, ih.linalg.GMRES)
    assert ih.Implicit(linear_solver="gmres").linear_solver == ih.linalg.GMRES()  # as given


def test_names_and_instances_solve_alike(tanh_problem) -> None:
    p = tanh_problem()
    by_name = ih.fixed_point(p.f, p.z0, *p.args, solver="anderson", adjoint="implicit")
    by_object = ih.fixed_point(p.f, p.z0, *p.args, solver=ih.Anderson(), adjoint=ih.Implicit())
    assert torch.equal(by_name.value, by_object.value)


def test_hydra_instantiates_solvers_and_adjoints_from_config() -> None:
    instantiate = pytest.importorskip("hydra.utils", reason=NEEDS_HYDRA).instantiate
    OmegaConf = pytest.importorskip("omegaconf", reason=NEEDS_HYDRA).OmegaConf
    cfg = OmegaConf.create(
        {
            "solver": {"_target_": "implicit_ham.Anderson", "m": 3, "tol": 1e-6},
            "adjoint": {"_target_": "implicit_ham.Implicit", "linear_solver": "dense", "tol": 1e-9},
            "phantom": {"_target_": "implicit_ham.Phantom", "k": 4, "tau": 0.5},
        }
    )
    solver, adjoint, phantom = (instantiate(cfg[key]) for key in ("solver", "adjoint", "phantom"))
    assert solver == ih.Anderson(m=3, tol=1e-6) and isinstance(solver, FixedPointSolver)
    assert adjoint == ih.Implicit(linear_solver=ih.linalg.Dense(), tol=1e-9)
    assert phantom == ih.Phantom(k=4, tau=0.5)


def test_hydra_config_with_a_typo_fails() -> None:
    instantiate = pytest.importorskip("hydra.utils", reason=NEEDS_HYDRA).instantiate
    OmegaConf = pytest.importorskip("omegaconf", reason=NEEDS_HYDRA).OmegaConf
    cfg = OmegaConf.create({"_target_": "implicit_ham.Truncated", "kk": 2})
    with pytest.raises(Exception, match="kk"):
        instantiate(cfg)


# --- user-registered backward modes ------------------------------------------------------------


@pytest.fixture
def isolated_adjoint_registry(monkeypatch):
    """Registrations made by a test are undone afterwards."""
    monkeypatch.setattr(ih.plugins.ADJOINTS, "_entries", dict(ih.plugins.ADJOINTS._entries))


def test_user_registered_adjoint_is_usable_by_name(isolated_adjoint_registry, tanh_problem):
    @ih.plugins.register_adjoint("last_two_steps")
    @dataclasses.dataclass(frozen=True)
    class LastTwoSteps(ih.plugins.ThroughIterations):
        """Backpropagate through the last two iterations."""

        def grad_steps(self, solver: FixedPointSolver) -> int:
            return 2

    assert "last_two_steps" in ih.plugins.ADJOINTS.names()
    assert isinstance(ih.plugins.make_adjoint("last_two_steps"), LastTwoSteps)
    p = tanh_problem()
    solver = ih.FixedPointIteration(max_steps=6)
    custom = ih.fixed_point(p.f, p.z0, *p.args, solver=solver, adjoint="last_two_steps")
    reference = ih.fixed_point(p.f, p.z0, *p.args, solver=solver, adjoint=ih.Truncated(2))
    got = torch.autograd.grad(custom.value.sum(), p.args)
    expected = torch.autograd.grad(reference.value.sum(), p.args)
    for a, b in zip(got, expected, strict=True):
        assert torch.equal(a, b)
    assert ih.plugins.make_adjoint("last_two_steps").name == "last_two_steps"


def test_registering_a_taken_name_is_an_error(isolated_adjoint_registry) -> None:
    with pytest.raises(ValueError, match="'unroll' is already registered to Unroll"):

        @ih.plugins.register_adjoint("unroll")
        class Impostor(ih.Unroll):
            pass


def test_every_linear_solver_returns_a_named_linear_solve() -> None:
    """``solve`` returns ``LinearSolve(g, steps, cond)``; g solves the 1-D system
    g = 0.5 g + v exactly (g = 2 v)."""
    import torch

    op = ih.plugins.AdjointOperator(lambda g: 0.5 * g, lambda rows: 0.5 * rows, 3)
    v = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    for name in ("gmres", "dense", "fixed_point", "anderson", "broyden"):
        result = ih.plugins.make_linear_solver(name).solve(op, v, 200, 1e-12)
        assert isinstance(result, ih.plugins.LinearSolve), name
        torch.testing.assert_close(result.g, 2 * v, rtol=1e-9, atol=1e-12, msg=name)
        assert result.steps >= 1
