"""Registries: a plug-in registered again (a notebook cell run twice) with ``replace=True``,
the very same class again, and ``unregister``."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import implicit_ham as ih
from implicit_ham._core.registry import Registry


def define_solver() -> type:
    """What a notebook cell does each time it runs: a new class object under the same name."""

    @dataclasses.dataclass(frozen=True)
    class Damped(ih.plugins.FixedPointSolver):
        max_steps: int = 8
        tol: float | None = None

        def solve(self, f, z0, spec):
            inner = ih.FixedPointIteration(max_steps=self.max_steps, tol=self.tol, damping=0.5)
            z, stats = inner.solve(f, z0, spec)
            return z, dataclasses.replace(stats, solver=self.name)

    return Damped


@pytest.fixture
def isolated_solvers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Registrations made by a test are undone afterwards."""
    solvers = ih.plugins.SOLVERS
    monkeypatch.setattr(solvers, "_entries", dict(solvers._entries))
    monkeypatch.setattr(solvers, "_names", dict(solvers._names))


def test_a_cell_run_twice_replaces_its_plugin_when_asked(isolated_solvers: None) -> None:
    first = ih.plugins.register_solver("damped_cell")(define_solver())
    assert ih.plugins.register_solver("damped_cell")(first) is first  # the same class: no-op
    second = define_solver()
    with pytest.raises(ValueError, match=r"already registered to .*pass replace=True") as info:
        ih.plugins.register_solver("damped_cell")(second)
    assert "unregister('damped_cell')" in str(info.value)
    ih.plugins.register_solver("damped_cell", replace=True)(second)
    built = ih.plugins.make_solver("damped_cell")
    assert type(built) is second and built.name == "damped_cell"
    assert ih.plugins.SOLVERS.name_of(first()) is None  # the replaced class has no name now
    x = torch.randn(2, 3)
    sol = ih.fixed_point(lambda z, x: torch.tanh(0.5 * z + x), torch.zeros(2, 3), x,
                         solver="damped_cell")  # fmt: skip
    assert sol.stats.solver == "damped_cell"


def test_unregister_removes_a_name_and_lists_the_known_ones(isolated_solvers: None) -> None:
    cls = ih.plugins.register_solver("damped_gone")(define_solver())
    assert ih.plugins.SOLVERS.unregister("damped_gone") is cls
    assert "damped_gone" not in ih.plugins.SOLVERS.names()
    with pytest.raises(KeyError, match=r"unknown solver 'damped_gone'; valid choices: .*anderson"):
        ih.plugins.make_solver("damped_gone")
    with pytest.raises(KeyError, match="unknown solver 'damped_gone'"):
        ih.plugins.SOLVERS.unregister("damped_gone")
    ih.plugins.register_solver("damped_gone")(define_solver())  # free again


def test_a_class_under_two_names_keeps_the_other_when_one_goes() -> None:
    registry: Registry[object] = Registry("thing")

    class Thing:
        pass

    registry.register("a")(Thing)
    registry.register("b")(Thing)
    assert registry.name_of(Thing()) == "a"
    registry.unregister("a")
    assert registry.name_of(Thing()) == "b" and registry.names() == ["b"]


def test_a_decomposition_replaces_its_registration_too(monkeypatch: pytest.MonkeyPatch) -> None:
    registry = ih.plugins.DECOMPOSITIONS
    monkeypatch.setattr(registry, "_entries", dict(registry._entries))
    monkeypatch.setattr(registry, "_names", dict(registry._names))

    def define() -> type:
        class Rank1(ih.SVD):
            pass

        return Rank1

    ih.register_decomposition("rank1_cell")(define())
    again = define()
    with pytest.raises(ValueError, match="replace=True"):
        ih.register_decomposition("rank1_cell")(again)
    ih.register_decomposition("rank1_cell", replace=True)(again)
    assert type(ih.make_decomposition("rank1_cell", rank=1)) is again
