"""The built-in names of the library's registries, for tests that mean "every built-in one".

A test that checks every solver / backward mode / linear solver / decomposition takes its list
from the registry here instead of typing names, so a new built-in is tested without editing the
test. Plug-ins that other test modules register (their classes live outside ``implicit_ham``)
are left out. torchdeq's solvers need the optional ``torchdeq`` extra: without it
``builtin_params`` keeps them as skipped cases (with the reason) and ``usable_names`` leaves
them out.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

import pytest

from implicit_ham._core.registry import Registry

# the library modules whose classes need an optional extra, and that extra
EXTRA_OF_MODULE = {"implicit_ham.solvers.torchdeq": "torchdeq"}


def torchdeq_available() -> bool:
    """Whether the optional ``torchdeq`` extra is installed."""
    return importlib.util.find_spec("torchdeq") is not None


def with_torchdeq(value: Any, id: str | None = None) -> Any:
    """``value`` as a ``pytest.param`` skipped (with the extra to install) without torchdeq."""
    reason = "needs torchdeq: pip install 'implicit-ham[torchdeq]'"
    mark = pytest.mark.skipif(not torchdeq_available(), reason=reason)
    return pytest.param(value, marks=mark, id=id)


def missing_extra(cls: type) -> str | None:
    """The optional extra ``cls`` needs and this install lacks, or None."""
    extra = EXTRA_OF_MODULE.get(cls.__module__)
    if extra is None or importlib.util.find_spec(extra) is not None:
        return None
    return extra


def builtin_names(registry: Registry[Any]) -> list[str]:
    """The registry's names of the library's own classes, sorted (usable here or not)."""
    return [n for n in registry.names() if registry.get(n).__module__.startswith("implicit_ham.")]


def usable_names(
    registry: Registry[Any], where: Callable[[type], bool] | None = None
) -> list[str]:
    """``builtin_names`` less the classes whose optional extra is not installed, and (when
    ``where`` is given) less those whose class fails ``where`` (e.g. ``requires_spd``)."""
    return [
        n
        for n in builtin_names(registry)
        if missing_extra(registry.get(n)) is None and (where is None or where(registry.get(n)))
    ]


def builtin_params(registry: Registry[Any]) -> list[Any]:
    """``builtin_names`` as ``pytest.param`` values, those whose optional extra is missing
    marked skip with the extra to install."""
    params = []
    for name in builtin_names(registry):
        extra = missing_extra(registry.get(name))
        marks = (
            [pytest.mark.skip(reason=f"{name} needs pip install 'implicit-ham[{extra}]'")]
            if extra
            else []
        )
        params.append(pytest.param(name, marks=marks, id=name))
    return params
