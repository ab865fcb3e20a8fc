"""The decomposition registry: config names -> ``Decomposition`` classes.

It reuses the core ``Registry`` (unknown names and unknown options list the valid ones; options
are followed up the constructor chain, so a subclass may add its own, ``beta`` for CD, and
forward the base ones with ``**kwargs``); ``register`` accepts only ``Decomposition`` subclasses.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from implicit_ham._core.registry import Registry
from implicit_ham.decompositions.base import Decomposition


class DecompositionRegistry(Registry[Decomposition]):
    """A ``Registry`` of ``Decomposition`` classes (see the module docstring)."""

    def register(
        self, name: str, *, replace: bool = False
    ) -> Callable[[type[Decomposition]], type[Decomposition]]:
        """Class decorator; the class must subclass ``Decomposition`` (``replace`` as in
        ``Registry.register``)."""
        inner = super().register(name, replace=replace)

        def decorator(cls: type[Decomposition]) -> type[Decomposition]:
            if not (isinstance(cls, type) and issubclass(cls, Decomposition)):
                raise TypeError(
                    f"register_decomposition({name!r}) decorates Decomposition subclasses, got "
                    f"{cls!r}; derive the class from ih.Decomposition."
                )
            return inner(cls)

        return decorator


DECOMPOSITIONS = DecompositionRegistry("decomposition")


def register_decomposition(
    name: str, *, replace: bool = False
) -> Callable[[type[Decomposition]], type[Decomposition]]:
    """Class decorator registering a ``Decomposition`` subclass under ``name``; it then works
    with ``make_decomposition``, ``make_context`` and every solver / backward mode.
    Registering the same class again is a no-op; another class under a taken name is an error
    unless ``replace=True`` (a notebook cell run again); ``DECOMPOSITIONS.unregister(name)``
    removes a name."""
    return DECOMPOSITIONS.register(name, replace=replace)


def make_decomposition(name: str, **kwargs: Any) -> Decomposition:
    """Build the decomposition registered as ``name`` with constructor options ``kwargs``;
    unknown names and unknown options raise errors listing the valid choices."""
    return DECOMPOSITIONS.make(name, **kwargs)
