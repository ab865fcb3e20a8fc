"""A Griffe extension (loaded by mkdocstrings, see mkdocs.yml) that lets each API page render
its namespace's ``__all__`` as Python sees it at run time, where static analysis alone loses
three kinds of public name:

* **a function shadowed by its own submodule**: ``implicit_ham/problems/__init__.py`` imports
  ``root`` from ``implicit_ham/problems/root.py``; at run time ``implicit_ham.problems.root`` is
  the function, but Griffe gives a submodule precedence over a member of the same name (see
  Griffe's "avoid member-submodule name shadowing"), so the function would be missing from the
  page (and ``implicit_ham.root``, an alias of it, would point at the module). Where an
  exported name is a submodule that defines a non-module member of the same name, the member
  takes the name's place, as at run time.
* **a function built at run time**: ``make_solver = SOLVERS.make_function(...)`` is an
  attribute without a docstring to static analysis, so it would not be rendered. An exported
  attribute whose run-time value is a function becomes that function (its signature and
  docstring as ``inspect`` reports them).
* **an undocumented constant**: a registry (``SOLVERS``, ...) or a tuple of choices
  (``FAILURE_KINDS``, ...) gets a generated one-line docstring (a registry's lists its built-in
  names), so that it is rendered with its value.

``tests/docs/test_api_reference.py`` checks every namespace's ``__all__`` against the
built site, so a name this extension (or the library) loses fails a test.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Iterator
from contextlib import suppress
from typing import Any

import griffe

PACKAGE = "implicit_ham"


class PublicAPI(griffe.Extension):
    """Re-wires the loaded ``implicit_ham`` package so that every exported name is rendered."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        """Run once the whole package is loaded, before mkdocstrings resolves and renders it."""
        if pkg.name != PACKAGE:
            return
        modules = list(_modules(pkg))
        for module in modules:  # pin every alias's target while all module paths still resolve
            _pin_alias_targets(module)
        for module in modules:
            _unshadow_exports(module)
        for module in modules:
            _document_exported_attributes(module, loader)


def _modules(module: griffe.Module) -> Iterator[griffe.Module]:
    """``module`` and its submodules, recursively (aliases excluded)."""
    yield module
    for member in list(module.members.values()):
        if not member.is_alias and member.is_module:
            yield from _modules(member)  # type: ignore[arg-type]


def _pin_alias_targets(obj: griffe.Object) -> None:
    """Resolve (and so cache) the target of every alias in ``obj``, its classes included."""
    for member in list(obj.members.values()):
        if member.is_alias:
            with suppress(griffe.AliasResolutionError, griffe.CyclicAliasError):
                _ = member.final_target  # type: ignore[union-attr]
        elif member.is_class:
            _pin_alias_targets(member)  # type: ignore[arg-type]


def _exports(module: griffe.Module) -> list[str]:
    """The names in the module's ``__all__`` (empty when it has none)."""
    return [str(name) for name in module.exports or ()]


def _unshadow_exports(module: griffe.Module) -> None:
    """An exported name that is a submodule defining a same-named member becomes that member."""
    for name in _exports(module):
        member = module.members.get(name)
        if member is None or member.is_alias or not member.is_module:
            continue
        inner = member.members.get(name)
        if inner is None or inner.is_module:
            continue
        target = inner.final_target if inner.is_alias else inner  # type: ignore[union-attr]
        module.set_member(name, griffe.Alias(name, target, lineno=target.lineno, parent=module))


def _document_exported_attributes(module: griffe.Module, loader: griffe.GriffeLoader) -> None:
    """Give each exported, undocumented attribute what it needs to be rendered: a function
    built at run time becomes a function; a constant gets a generated docstring."""
    for name in _exports(module):
        member = module.members.get(name)
        if member is None:
            continue
        try:
            attribute = member.final_target if member.is_alias else member  # type: ignore[union-attr]
        except (griffe.AliasResolutionError, griffe.CyclicAliasError):
            continue
        defining = attribute.parent
        if not attribute.is_attribute or attribute.docstring is not None or defining is None:
            continue
        value = getattr(importlib.import_module(defining.path), attribute.name)
        if inspect.isfunction(value) and value.__doc__:
            defining.set_member(attribute.name, _function(attribute, value, loader))  # type: ignore[arg-type]
        else:
            attribute.docstring = _docstring(_describe(value), attribute, loader)  # type: ignore[arg-type]


def _function(attribute: griffe.Object, value: Any, loader: griffe.GriffeLoader) -> griffe.Function:
    """A Griffe function for the run-time function ``value`` bound to ``attribute``'s name."""
    signature = inspect.signature(value)
    parameters = griffe.Parameters(
        *(
            griffe.Parameter(
                p.name,
                annotation=None if p.annotation is p.empty else _annotation(p.annotation),
                kind=griffe.ParameterKind(p.kind.description),  # the same words
                default=None if p.default is p.empty else repr(p.default),
            )
            for p in signature.parameters.values()
        )
    )
    returns = signature.return_annotation
    function = griffe.Function(
        attribute.name,
        lineno=attribute.lineno,
        endlineno=attribute.endlineno,
        parameters=parameters,
        returns=None if returns is inspect.Signature.empty else _annotation(returns),
    )
    function.docstring = _docstring(inspect.cleandoc(value.__doc__), function, loader)
    return function


def _annotation(annotation: Any) -> str:
    """An annotation as text (they are strings under ``from __future__ import annotations``)."""
    return annotation if isinstance(annotation, str) else inspect.formatannotation(annotation)


def _describe(value: Any) -> str:
    """A one-line description of an undocumented public constant."""
    names = getattr(value, "names", None)
    kind = getattr(value, "kind", None)
    if callable(names) and isinstance(kind, str):
        built_in = ", ".join(f"`{name}`" for name in names())
        return f"The {kind} registry (name -> class). Built-in names: {built_in}."
    if isinstance(value, tuple) and all(isinstance(item, str) for item in value):
        return "The valid values: " + ", ".join(f"`{item}`" for item in value) + "."
    return f"A constant of `{type(value).__name__}` type; its value is shown above."


def _docstring(text: str, parent: griffe.Object, loader: griffe.GriffeLoader) -> griffe.Docstring:
    """A docstring parsed like the ones Griffe reads from the source."""
    return griffe.Docstring(
        text,
        parent=parent,
        parser=loader.docstring_parser,
        parser_options=loader.docstring_options,
    )
