"""The decomposition registry: config names -> ``Decomposition`` classes.

It reuses the core ``Registry`` (unknown names list the valid ones) and extends two things:
``register`` accepts only ``Decomposition`` subclasses, and ``make`` validates keyword arguments
against the whole constructor chain, so a subclass may add its own options (``beta`` for CD)
and forward the base ones with ``**kwargs``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from ..registry import Registry
from .base import Decomposition


class DecompositionRegistry(Registry[Decomposition]):
    """A ``Registry`` of ``Decomposition`` classes (see the module docstring)."""

    def register(self, name: str) -> Callable[[type[Decomposition]], type[Decomposition]]:
        """Class decorator; the class must subclass ``Decomposition``."""
        inner = super().register(name)

        def decorator(cls: type[Decomposition]) -> type[Decomposition]:
            if not (isinstance(cls, type) and issubclass(cls, Decomposition)):
                raise TypeError(
                    f"register_decomposition({name!r}) decorates Decomposition subclasses, got "
                    f"{cls!r}; derive the class from ih.Decomposition."
                )
            return inner(cls)

        return decorator

    def make(self, name: str, **kwargs: Any) -> Decomposition:
        """Instantiate ``name``, rejecting keyword arguments no constructor in the chain takes."""
        cls = self.get(name)
        valid = constructor_options(cls)
        unknown = sorted(set(kwargs) - set(valid))
        if unknown:
            raise TypeError(
                f"unknown option(s) {', '.join(unknown)} for {self.kind} {name!r}; "
                f"valid options: {', '.join(valid)}"
            )
        return cls(**kwargs)


def constructor_options(cls: type) -> list[str]:
    """The keyword names ``cls(...)`` accepts, following ``**kwargs`` up the class chain."""
    names: list[str] = []
    for klass in cls.__mro__:
        if "__init__" not in vars(klass):
            continue
        params = inspect.signature(vars(klass)["__init__"]).parameters.values()
        names += [
            p.name
            for p in params
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
            and p.name != "self"
            and p.name not in names
        ]
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            break
    return names


DECOMPOSITIONS = DecompositionRegistry("decomposition")


def register_decomposition(name: str) -> Callable[[type[Decomposition]], type[Decomposition]]:
    """Class decorator registering a ``Decomposition`` subclass under ``name``; it then works
    with ``get_decomposition``, ``make_context`` and every solver / backward mode."""
    return DECOMPOSITIONS.register(name)


def get_decomposition(name: str, **kwargs: Any) -> Decomposition:
    """Build the decomposition registered as ``name`` with constructor options ``kwargs``;
    unknown names and unknown options raise errors listing the valid choices."""
    return DECOMPOSITIONS.make(name, **kwargs)
