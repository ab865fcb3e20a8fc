"""A small name -> class registry that fails loudly on unknown names and unknown keys.

Solvers, linear solvers, backward modes and decompositions are small dataclasses; config files
and sweeps name them by string. A typo must never be silently ignored, so both an unknown name
and an unknown keyword argument raise an error that lists the valid choices.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Maps config names to classes of one kind (e.g. "adjoint" -> Unroll, OneStep, ...)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, type[T]] = {}
        self._names: dict[type, str] = {}  # class -> name (solves look names up on every call)

    def register(self, name: str, *, replace: bool = False) -> Callable[[type[T]], type[T]]:
        """Class decorator: ``@REGISTRY.register("name")``. Registering the very same class
        again is a no-op; registering another class under a taken name is an error unless
        ``replace=True`` (e.g. a notebook cell that defines the class run again), which
        replaces the entry."""

        def decorator(cls: type[T]) -> type[T]:
            current = self._entries.get(name)
            if current is not None and current is not cls:
                if not replace:
                    raise ValueError(
                        f"{self.kind} name {name!r} is already registered to "
                        f"{current.__qualname__}; choose another name, pass replace=True to "
                        f"replace it (e.g. a notebook cell run again), or remove it first "
                        f"with the registry's unregister({name!r})."
                    )
                self._forget(name, current)
            self._entries[name] = cls
            self._names.setdefault(cls, name)
            _list_options_on_error(cls)
            return cls

        return decorator

    def unregister(self, name: str) -> type[T]:
        """Remove ``name`` and return the class it named; an unknown name is a KeyError listing
        the registered ones. Instances already built keep working; ``make(name)`` and configs
        naming it fail until it is registered again."""
        cls = self.get(name)
        self._forget(name, cls)
        return cls

    def _forget(self, name: str, cls: type[T]) -> None:
        """Drop the entry ``name`` -> ``cls`` and, if it was ``cls``'s name, point ``cls`` at
        another name it is registered under (or none)."""
        del self._entries[name]
        if self._names.get(cls) == name:
            del self._names[cls]
            other = next((n for n, c in self._entries.items() if c is cls), None)
            if other is not None:
                self._names[cls] = other

    def names(self) -> list[str]:
        """The registered names, sorted."""
        return sorted(self._entries)

    def get(self, name: str) -> type[T]:
        """The class registered under ``name``; unknown names list the valid ones."""
        if name not in self._entries:
            raise KeyError(
                f"unknown {self.kind} {name!r}; valid choices: {', '.join(self.names())}"
            )
        return self._entries[name]

    def name_of(self, obj: object) -> str | None:
        """The registered name of ``obj``'s class, or None."""
        cls = type(obj)
        name = self._names.get(cls)
        if name is not None and self._entries.get(name) is cls:
            return name
        return next((n for n, c in self._entries.items() if c is cls), None)

    def make(self, name: str, **kwargs: Any) -> T:
        """Instantiate the class registered under ``name``, rejecting unknown keyword arguments."""
        cls = self.get(name)
        check_options(cls, kwargs, f"{self.kind} {name!r}")
        return cls(**kwargs)

    def make_function(self, function: str, module: str) -> Callable[..., T]:
        """A module-level ``make_<kind>(name, **options)`` for this registry (the public entry
        point; ``module`` is where it is documented)."""

        def make(name: str, **options: Any) -> T:
            return self.make(name, **options)

        return _module_function(
            make,
            function,
            module,
            f"Build the {self.kind} registered as ``name`` with constructor ``options``; an "
            "unknown name or option raises an error listing the valid choices.",
        )

    def register_function(
        self, function: str, module: str
    ) -> Callable[..., Callable[[type[T]], type[T]]]:
        """A module-level ``register_<kind>(name, *, replace=False)`` class decorator for this
        registry."""

        def register(name: str, *, replace: bool = False) -> Callable[[type[T]], type[T]]:
            return self.register(name, replace=replace)

        return _module_function(
            register,
            function,
            module,
            f"Class decorator: register a {self.kind} under ``name`` (usable from configs and "
            "``make_*``). Registering the same class again is a no-op; registering another "
            "class under a taken name is an error unless ``replace=True`` (a notebook cell run "
            "again); the registry's ``unregister(name)`` removes a name.",
        )

    def resolve(self, spec: T | str, base: type) -> T:
        """Accept an instance of ``base`` or a registered name; anything else is an error."""
        if isinstance(spec, str):
            return self.make(spec)
        if not isinstance(spec, base):
            raise TypeError(
                f"expected a {self.kind} ({base.__name__} instance or one of "
                f"{', '.join(self.names())}), got {type(spec).__name__}"
            )
        return spec


def _list_options_on_error(cls: type) -> None:
    """Make ``cls(...)`` with an unknown keyword raise the TypeError of ``check_options`` (the
    valid options listed), as ``make`` does, instead of Python's bare "unexpected keyword
    argument": the class constructors are the public API too (``ih.Anderson(max_iter=30)``)."""
    init = vars(cls).get("__init__")
    if init is None or getattr(init, "_lists_options", False):
        return

    @functools.wraps(init)
    def listing_init(self: Any, *args: Any, **kwargs: Any) -> None:
        try:
            init(self, *args, **kwargs)
        except TypeError:
            check_options(type(self), kwargs, type(self).__name__)  # raises on unknown keys
            raise

    listing_init._lists_options = True  # type: ignore[attr-defined]
    cls.__init__ = listing_init  # type: ignore[misc]


def check_options(cls: type, kwargs: dict[str, Any], owner: str) -> None:
    """Raise TypeError naming the keys of ``kwargs`` that ``cls(...)`` does not accept, with the
    valid ones (``owner`` names the thing being built in the message)."""
    valid = parameter_names(cls)
    unknown = sorted(set(kwargs) - set(valid))
    if unknown:
        raise TypeError(
            f"unknown option(s) {', '.join(unknown)} for {owner}; "
            f"valid options: {', '.join(valid) or '(none)'}"
        )


def parameter_names(cls: type) -> list[str]:
    """The keyword names ``cls(...)`` accepts: a dataclass's init fields, or the named
    parameters of ``__init__`` followed up the class chain while they forward ``**kwargs``
    (up to a class that declares its ``**kwargs`` as the init fields of a dataclass, its
    class attribute ``keyword_options``: ``Decomposition``)."""
    if dataclasses.is_dataclass(cls):
        return [f.name for f in dataclasses.fields(cls) if f.init]
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
        options = vars(klass).get("keyword_options")
        if options is not None:  # **kwargs are the fields of this options dataclass
            names += [f.name for f in dataclasses.fields(options) if f.init and f.name not in names]
            break
    return names


F = TypeVar("F", bound=Callable[..., Any])


def _module_function(fn: F, name: str, module: str, doc: str) -> F:
    """``fn`` presented as the module-level function ``module.name`` with docstring ``doc``
    (how the API reference and ``help()`` show it)."""
    fn.__name__ = fn.__qualname__ = name
    fn.__module__ = module
    fn.__doc__ = doc
    return fn
