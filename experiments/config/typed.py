"""The run configuration as a typed object, and back to the plain dict that files hold.

Hydra composes a ``DictConfig`` against a structured schema (``TrainConfig``);
``typed_config`` turns it into instances of the schema's dataclasses (``OmegaConf.to_object``),
so the engine reads ``cfg.optim.lr`` and mypy checks it. Every group node is an instance of a
generated or hand-written dataclass whose base is one of the classes below: ``TargetConf``
(anything ``hydra.utils.instantiate`` builds: solvers, backward modes, data, loggers),
``ContextConf`` (a ``make_context`` node, whose ``name`` says decomposition or baseline) and
``OptimConf`` (a partial optimiser). ``instantiate`` accepts these dataclass instances as it
accepts a ``DictConfig``, nested nodes included (``adjoint.linear_solver``).

``as_container`` is the inverse for files: the nested dict of plain values that
``results.json``, checkpoints and sinks get (equal to ``OmegaConf.to_container(cfg,
resolve=True)`` of the composed config, so resume comparisons against files written before the
typed config still match).
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from omegaconf import MISSING, DictConfig, OmegaConf

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

Schema = TypeVar("Schema")


@dataclasses.dataclass
class TargetConf:
    """Base of every config node that ``hydra.utils.instantiate`` builds: ``_target_`` is the
    dotted path of the class or function called."""

    _target_: str = MISSING


@dataclasses.dataclass
class ContextConf(TargetConf):
    """Base of the ``context`` group (``_target_``: ``implicit_ham.make_context``): ``name``
    is a decomposition (built with the run's solver and backward mode) or a baseline."""

    name: str = MISSING


@dataclasses.dataclass
class OptimConf(TargetConf):
    """Base of the ``optim`` group: a partial optimiser (called on the parameters) and its
    learning rate (scaled for the backbone's parameter group when fine-tuning)."""

    _partial_: bool = True
    lr: float = MISSING


def typed_config(cfg: DictConfig, schema: type[Schema]) -> Schema:
    """The composed ``cfg`` as an instance of ``schema`` (interpolations resolved).

    Raises:
        omegaconf.errors.MissingMandatoryValue: a value that must be set is not (e.g.
            ``data.root`` of ``data=cifar10``), before the job writes anything.
        TypeError: ``cfg`` was composed against another schema.
        ValueError: a key that its node's schema does not define (``check_known_keys``).
    """
    check_known_keys(cfg)
    value = OmegaConf.to_object(cfg)
    if not isinstance(value, schema):
        raise TypeError(
            f"the composed config is a {type(value).__name__}, not a {schema.__name__}: compose "
            f"it from a config whose defaults list starts with the {schema.__name__} schema "
            "(conf/config.yaml: train_schema)"
        )
    return value


def check_known_keys(cfg: DictConfig) -> None:
    """ValueError naming every key of ``cfg`` that its node's schema (a dataclass) does not
    define, with the closest valid keys. Hydra refuses a misspelt key (``context.stpes=3``) but
    suggests ``+context.stpes=3``, which adds it: the run would then ignore it silently and train
    with the default (``context.steps`` stays 6). Called by ``typed_config``, before the job
    writes anything."""
    unknown = list(_unknown_keys(cfg, ""))
    if not unknown:
        return
    lines = []
    for path, known in unknown:
        close = difflib.get_close_matches(path.rsplit(".", 1)[-1], known, n=1)
        prefix = path.rsplit(".", 1)[0] + "." if "." in path else ""
        hint = f"did you mean {prefix}{close[0]}?" if close else f"valid: {', '.join(known)}"
        lines.append(f"{path} ({hint})")
    raise ValueError(
        f"unknown config key(s): {'; '.join(lines)}. The run reads only its schema's keys, so a "
        "key added with '+' would be silently ignored; set the existing key instead (without "
        "'+')."
    )


def _unknown_keys(node: DictConfig, path: str) -> Iterator[tuple[str, list[str]]]:
    """(dotted path, the schema's keys) of each key of ``node`` and its sub-nodes that is not
    a field of the node's dataclass schema (nodes without one are not checked)."""
    schema = OmegaConf.get_type(node)
    known = (
        [f.name for f in dataclasses.fields(schema)]
        if isinstance(schema, type) and dataclasses.is_dataclass(schema)
        else None
    )
    for key in node:
        name = str(key)
        if known is not None and name not in known:
            yield f"{path}{name}", known
        child = node._get_node(name)
        if isinstance(child, DictConfig):
            yield from _unknown_keys(child, f"{path}{name}.")


def as_container(cfg: DataclassInstance) -> dict[str, Any]:
    """The typed config (or one of its nodes) as nested dicts of plain values."""
    return dataclasses.asdict(cfg)
