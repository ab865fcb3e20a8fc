"""Which ``_target_`` a config may name: an allowlist checked before anything is instantiated.

Hydra's ``instantiate`` imports and calls whatever dotted path a config's ``_target_`` names, so
a config-group YAML (a lab-mate's preset, a downloaded sweep) with ``_target_: os.system`` or
``torch.load`` runs code. ``check_targets`` walks the whole config (nested nodes and lists
included) and refuses, with ``UnsafeTargetError``, any ``_target_`` outside ``ALLOWED_PREFIXES``
(the library, the project's data / models / loggers, ``torch.optim`` and its schedulers). A
path under an allowed prefix is also resolved (importing only allowed modules) and the object
it reaches must be defined under an allowed prefix, so an attribute path through an allowed
module (``implicit_ham.some_module.os.system``) is refused too.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from typing import Any

ALLOWED_PREFIXES = (
    "implicit_ham.",
    "experiments.data.",
    "experiments.models.",
    "experiments.engine.sinks.",
    "torch.optim.",
    "torch.optim.lr_scheduler.",
)


class UnsafeTargetError(ValueError):
    """A config names a ``_target_`` outside the allowlist (the message names it)."""


def _targets(node: Any, where: str) -> Iterator[tuple[str, Any]]:
    if isinstance(node, Mapping):
        for key, value in node.items():
            if key == "_target_":
                yield where or "(root)", value
            else:
                yield from _targets(value, f"{where}.{key}" if where else str(key))
    elif isinstance(node, (list, tuple)):
        for i, value in enumerate(node):
            yield from _targets(value, f"{where}[{i}]")


def _allowed(path: str) -> bool:
    return any(path.startswith(prefix) for prefix in ALLOWED_PREFIXES)


def _defined_in(path: str) -> str | None:
    """The module defining the object ``path`` reaches (importing only allowed modules); None
    when it cannot be resolved here (e.g. an optional dependency is missing: instantiation then
    fails with its own error)."""
    parts = path.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        module_name = ".".join(parts[:cut])
        if not _allowed(module_name + "."):
            return None
        try:
            obj: Any = importlib.import_module(module_name)
        except ImportError:
            continue
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return None
        return getattr(obj, "__module__", None) or getattr(obj, "__name__", None)
    return None


def check_targets(config: Any) -> None:
    """Refuse any ``_target_`` of ``config`` (plain data: dicts / lists) outside the allowlist.

    Raises:
        UnsafeTargetError: naming the config key, the target and the allowed prefixes.
    """
    for where, target in _targets(config, ""):
        module = _defined_in(target) if isinstance(target, str) and _allowed(target) else None
        reason = None
        if not isinstance(target, str) or not _allowed(target):
            reason = "is not under an allowed prefix"
        elif module is not None and not _allowed(module + "."):
            reason = f"resolves to an object of {module}, outside the allowed prefixes"
        if reason is not None:
            raise UnsafeTargetError(
                f"config {where}: _target_ {target!r} {reason} "
                f"({', '.join(ALLOWED_PREFIXES)}); refused before anything was instantiated. "
                "Configs may only build the library's solvers / backward modes / contexts, the "
                "project's data, models and loggers, and torch.optim optimisers / schedulers."
            )
