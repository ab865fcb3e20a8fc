"""Start-up checks of the optimiser and learning-rate schedule values of ``experiments.train``.

Without them a value torch refuses (``optim.lr=-1``) fails only when the optimiser is built,
after the data and the model (tens of seconds later), and one torch accepts but no run wants
(``optim.momentum=1.5``: heavy-ball momentum >= 1 never damps; ``lr_poly_power=-1``) fails later
still or trains wrongly. ``check_optimizer`` checks every value of the ``optim`` group and of the
schedule (``lr_poly_power``, ``model.backbone_lr_scale``) by the rules below, then builds the
optimiser once on a stand-in parameter so that torch's own checks run too; each error names the
key and a value that works.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from hydra.errors import InstantiationException
from hydra.utils import instantiate

from experiments.config.typed import OptimConf

# key -> (rule as the message states it, test, an example of a good value)
Rule = tuple[str, Callable[[float], bool], str]
POSITIVE: Callable[[float], bool] = lambda v: math.isfinite(v) and v > 0  # noqa: E731
OPTIM_RULES: dict[str, Rule] = {
    "lr": ("a finite number > 0", POSITIVE, "3e-3"),
    "weight_decay": ("a finite number >= 0", lambda v: math.isfinite(v) and v >= 0, "1e-4"),
    "momentum": ("a number in [0, 1)", lambda v: 0 <= v < 1, "0.9"),
}
SCHEDULE_RULES: dict[str, Rule] = {
    "lr_poly_power": ("None or a finite number > 0", POSITIVE, "0.9 (the paper's)"),
    "model.backbone_lr_scale": ("None or a finite number > 0", POSITIVE, "0.1"),
}


def _check(key: str, value: Any, rule: Rule) -> None:
    text, test, example = rule
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not number or not test(float(value)):
        raise ValueError(
            f"{key}={value!r}: must be {text}; e.g. {key}={example} on the command line"
        )


def check_optimizer(
    optim: OptimConf, lr_poly_power: float | None, backbone_lr_scale: float | None
) -> None:
    """Check the optimiser and schedule values (module docstring); ValueError naming the key.

    Args:
        optim: the ``optim`` group (its ``lr``, and ``weight_decay`` / ``momentum`` where the
            option has them).
        lr_poly_power, backbone_lr_scale: the schedule values (None: off).
    """
    for key, rule in OPTIM_RULES.items():
        if hasattr(optim, key):
            _check(f"optim.{key}", getattr(optim, key), rule)
    schedule = {"lr_poly_power": lr_poly_power, "model.backbone_lr_scale": backbone_lr_scale}
    for key, value in schedule.items():
        if value is not None:
            _check(key, value, SCHEDULE_RULES[key])
    stand_in = torch.nn.Parameter(torch.zeros(1))
    with refused_in("optim", "lr=3e-3"):
        instantiate(optim)([stand_in])


@contextmanager
def refused_in(group: str, example: str = "<option>=<value>") -> Iterator[None]:
    """A ``TypeError`` / ``ValueError`` of the block (or Hydra's ``InstantiationException``
    around one) raised again as a ``ValueError`` naming the config group and an example
    setting (``group.example``)."""
    try:
        yield
    except (TypeError, ValueError, InstantiationException) as error:
        cause = error.__cause__ if isinstance(error, InstantiationException) else None
        raise ValueError(
            f"{group}: {cause or error} (a value of the {group}.* config options; fix it on the "
            f"command line, e.g. {group}.{example})"
        ) from error
