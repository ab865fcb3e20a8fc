"""Structured configs generated from signatures, so the configs cannot drift from the library.

``config_class(target)`` reads the keyword parameters of a class (its ``__init__``, followed up
the class chain while a constructor forwards ``**kwargs``, and into the options dataclass a class
names as ``keyword_options``, as ``implicit_ham.plugins.parameter_names`` does)
or of a function, with their type hints and defaults, and makes a dataclass with a ``_target_``
field that Hydra's ConfigStore accepts, derived from a typed base of its group
(``experiments.config.typed``). OmegaConf then checks every key and type at start-up.

Why not hydra-zen's ``builds(..., populate_full_signature=True)``: tried as a replacement, it
misses the decompositions' options (NMF, VQ and SVD get none, as it reads the inherited
``Decomposition.__new__(cls, *args, **kwargs)``; ``CD(rank, *, beta, **kwargs)`` gets ``rank``
and ``beta`` only, as it does not follow ``**kwargs`` up the class chain), types ``float | None``
parameters ``Any`` (OmegaConf would accept ``solver.tol=abc``) and writes module paths as
``_target_`` where the configs (and so the checkpoints resume compares against) hold the public
``implicit_ham.<Name>``. The comparison, case by case: docs/experiments.md, "Configs generated
from the library".
"""

from __future__ import annotations

import dataclasses
import inspect
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from omegaconf import MISSING

import implicit_ham
from experiments.config.typed import TargetConf

PRIMITIVES = (bool, int, float, str)


@dataclass(frozen=True)
class Parameter:
    """One keyword parameter: its name, its config type (OmegaConf-compatible) and default."""

    name: str
    type: Any
    default: Any


def target_path(target: Callable[..., Any]) -> str:
    """The dotted path Hydra instantiates: the public ``implicit_ham.<name>`` when the library
    exports ``target`` under its own name, else ``module.qualname``."""
    name = target.__name__
    if getattr(implicit_ham, name, None) is target:
        return f"implicit_ham.{name}"
    return f"{target.__module__}.{target.__qualname__}"


def config_type(hint: Any) -> Any:
    """The OmegaConf type of a type hint: a primitive, ``Optional`` of one, or ``Any``."""
    if hint in PRIMITIVES:
        return hint
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1 and rest[0] in PRIMITIVES:
            return typing.Optional[rest[0]]  # noqa: UP045 (OmegaConf needs the typing form)
    return Any


def _hints(function: Callable[..., Any]) -> dict[str, Any]:
    """The resolved type hints; none (every field ``Any``) when a hint names a type that only
    exists under ``TYPE_CHECKING`` (a plug-in's choice; the values are still checked by the
    constructor)."""
    try:
        return typing.get_type_hints(function)
    except NameError:
        return {}


def _signatures(target: Callable[..., Any]) -> Iterable[Callable[..., Any]]:
    """The functions whose parameters ``target(...)`` accepts, most derived first."""
    if not isinstance(target, type):
        yield target
        return
    for klass in target.__mro__:
        init = vars(klass).get("__init__")
        if init is None:
            continue
        yield init
        if not any(p.kind is p.VAR_KEYWORD for p in inspect.signature(init).parameters.values()):
            return
        options = vars(klass).get("keyword_options")
        if options is not None:  # its **kwargs are this dataclass's fields
            yield options.__init__
            return


def signature_parameters(target: Callable[..., Any]) -> list[Parameter]:
    """The keyword parameters of ``target`` (see the module docstring), in signature order;
    a parameter without a default gets ``MISSING`` (it must be set)."""
    found: dict[str, Parameter] = {}
    for function in _signatures(target):
        hints = _hints(function)
        for p in inspect.signature(function).parameters.values():
            if p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) or p.name == "self":
                continue
            default = MISSING if p.default is p.empty else p.default
            found.setdefault(p.name, Parameter(p.name, hints.get(p.name, Any), default))
    return list(found.values())


def _field(parameter: Parameter) -> tuple[str, Any, Any]:
    default = parameter.default
    kind = config_type(parameter.type)
    if default is MISSING or default is None or isinstance(default, PRIMITIVES):
        return parameter.name, kind, dataclasses.field(default=default)
    if dataclasses.is_dataclass(default) and isinstance(default, type):
        return parameter.name, Any, dataclasses.field(default_factory=default)
    return parameter.name, Any, dataclasses.field(default_factory=lambda: default)


def config_class(
    target: Callable[..., Any],
    *,
    base: type[TargetConf] = TargetConf,
    name: str | None = None,
    exclude: Iterable[str] = (),
    fixed: Mapping[str, Any] | None = None,
    extra: Iterable[Parameter] = (),
) -> type:
    """A dataclass config with ``_target_`` and one field per keyword parameter of ``target``.

    A parameter that takes a library object or its registry name (``Implicit.linear_solver``)
    is typed ``Any`` with the default name; Hydra replaces it by a nested config from a group
    (``conf/adjoint/implicit.yaml`` takes ``adjoint/linear_solver``), whose fields are then
    settable as ``adjoint.linear_solver.restart=40``.

    Args:
        target: a class or function.
        base: the dataclass the config derives from, the type of its group's field in the
            root schema (``TargetConf``, or ``ContextConf`` for ``make_context``).
        name: the dataclass's name (default ``<Target>Conf``).
        exclude: parameters left out (set by the caller at instantiation).
        fixed: fields put first with a fixed default (e.g. ``name`` for ``make_context``).
        extra: further parameters (e.g. a wrapper's options), added after ``fixed``.
    """
    skip = set(exclude)
    fields: list[tuple[str, Any, Any]] = [
        ("_target_", str, dataclasses.field(default=target_path(target)))
    ]
    fields += [(k, type(v), dataclasses.field(default=v)) for k, v in (fixed or {}).items()]
    fields += [_field(p) for p in extra]
    for parameter in signature_parameters(target):
        if parameter.name not in skip and all(f[0] != parameter.name for f in fields):
            fields.append(_field(parameter))
    label = name or f"{getattr(target, '__name__', 'Target')}Conf"
    return dataclasses.make_dataclass(label, fields, bases=(base,))
