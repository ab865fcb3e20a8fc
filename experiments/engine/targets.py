"""Which ``_target_`` a config may name: an allowlist checked before anything is instantiated.

Hydra's ``instantiate`` imports and calls whatever dotted path a config's ``_target_`` names, so
a config-group YAML (a lab-mate's preset, a downloaded sweep) with ``_target_: os.system`` or
``torch.load`` runs code. ``check_targets`` walks the whole config (nested nodes and lists
included) and refuses, with ``UnsafeTargetError``, any ``_target_`` outside ``ALLOWED_PREFIXES``
(the library, the project's data / models / loggers, ``torch.optim`` and its schedulers). A
path under an allowed prefix is also resolved (importing only allowed modules) and the object
it reaches must be defined under an allowed prefix, so an attribute path through an allowed
module (``implicit_ham.some_module.os.system``) is refused too.

Hydra itself instantiates ``hydra.callbacks`` right after composing the config, before the
command's function runs, and that node takes any keys: an experiment preset setting
``hydra.callbacks.x: {_target_: torch.load, f: ..., weights_only: false}`` ran its payload before
any check of the commands (found by the subprocess test). ``guard_hydra_callbacks`` (installed
by every command that checks its targets) checks those targets first, allowing only Hydra's own
callbacks (``HYDRA_CALLBACK_PREFIXES``) besides the allowlist.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Iterator, Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf

ALLOWED_PREFIXES = (
    "implicit_ham.",
    "experiments.data.",
    "experiments.models.",
    "experiments.engine.sinks.",
    "torch.optim.",
    "torch.optim.lr_scheduler.",
)

HYDRA_CALLBACK_PREFIXES = ("hydra.experimental.callbacks.",)


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


def _allowed(path: str, prefixes: tuple[str, ...] = ALLOWED_PREFIXES) -> bool:
    return any(path.startswith(prefix) for prefix in prefixes)


def _defined_in(path: str, prefixes: tuple[str, ...] = ALLOWED_PREFIXES) -> str | None:
    """The module defining the object ``path`` reaches (importing only allowed modules); None
    when it cannot be resolved here (e.g. an optional dependency is missing: instantiation then
    fails with its own error)."""
    parts = path.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        module_name = ".".join(parts[:cut])
        if not _allowed(module_name + ".", prefixes):
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


def check_targets(
    config: Any, prefixes: tuple[str, ...] = ALLOWED_PREFIXES, root: str = ""
) -> None:
    """Refuse any ``_target_`` of ``config`` (plain data: dicts / lists) outside the allowlist
    ``prefixes`` (``root``: the dotted key of ``config`` in the messages).

    Raises:
        UnsafeTargetError: naming the config key, the target and the allowed prefixes.
    """
    for where, target in _targets(config, root):
        allowed = isinstance(target, str) and _allowed(target, prefixes)
        module = _defined_in(target, prefixes) if allowed else None
        reason = None
        if not allowed:
            reason = "is not under an allowed prefix"
        elif module is not None and not _allowed(module + ".", prefixes):
            reason = f"resolves to an object of {module}, outside the allowed prefixes"
        if reason is not None:
            raise UnsafeTargetError(
                f"config {where}: _target_ {target!r} {reason} "
                f"({', '.join(prefixes)}); refused before anything was instantiated. "
                "Configs may only build the library's solvers / backward modes / contexts, the "
                "project's data, models and loggers, and torch.optim optimisers / schedulers."
            )


def check_hydra_callbacks(config: DictConfig | None) -> None:
    """Refuse a ``hydra.callbacks`` target of a composed config outside the allowlist and
    Hydra's own callbacks (``UnsafeTargetError``)."""
    callbacks = None if config is None else OmegaConf.select(config, "hydra.callbacks")
    if callbacks:
        plain = OmegaConf.to_container(callbacks, resolve=False)
        check_targets(plain, (*ALLOWED_PREFIXES, *HYDRA_CALLBACK_PREFIXES), "hydra.callbacks")


def guard_hydra_callbacks() -> None:
    """Make Hydra check ``hydra.callbacks`` (``check_hydra_callbacks``) before it instantiates
    them (wraps ``hydra._internal.callbacks.Callbacks.__init__``, the one place that does;
    installed once)."""
    from hydra._internal.callbacks import Callbacks

    init = Callbacks.__init__
    if getattr(init, "_checks_targets", False):
        return

    @functools.wraps(init)
    def checked(self: Callbacks, config: DictConfig | None = None) -> None:
        check_hydra_callbacks(config)
        init(self, config)

    checked._checks_targets = True  # type: ignore[attr-defined]
    Callbacks.__init__ = checked  # type: ignore[method-assign]
