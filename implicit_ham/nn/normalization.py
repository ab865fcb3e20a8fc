"""Weight and spectral normalisation of a fixed-point map's layers (TorchDEQ's ``apply_norm``),
built on ``torch.nn.utils.parametrizations``.

``apply_norm(module, kind)`` parametrises the ``weight`` of every ``nn.Linear`` / ``nn.Conv*``
submodule (names can be filtered); ``remove_norm(module)`` turns them back into plain
parameters holding the normalised value. Inside ``ih.fixed_point(f, ...)`` with ``f`` the
module (or one of its methods) the parametrised weights are computed once per solve, not once
per iteration (the solve runs under ``torch.nn.utils.parametrize.cached()``, primed with
gradient): a spectral norm's power iteration then also runs once per solve. For any other
callable ``f`` (a closure over the module) they are recomputed at every evaluation: correct,
slower.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from torch import nn
from torch.nn.utils import parametrizations, parametrize

logger = logging.getLogger(__name__)

NORM_KINDS: dict[str, Callable[..., nn.Module]] = {
    "weight": parametrizations.weight_norm,
    "spectral": parametrizations.spectral_norm,
}
_NORMALISED = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)


def apply_norm(
    module: nn.Module,
    kind: str = "weight",
    *,
    include: Sequence[str] | None = None,
    exclude: Sequence[str] = (),
    **options: object,
) -> list[str]:
    """Parametrise the weights of ``module``'s linear and convolution layers, in place.

    Args:
        module: the map's module (e.g. a DEQ cell); itself included if it is such a layer.
        kind: "weight" (``weight_norm``: ``w = g v / ||v||``) or "spectral" (``spectral_norm``:
            ``w / sigma_max(w)`` by power iteration).
        include: if given, only submodules whose qualified name contains one of these strings.
        exclude: skip submodules whose qualified name contains one of these strings (like
            TorchDEQ's ``filter_out``).
        **options: passed to the torch parametrisation (e.g. ``dim`` for weight norm,
            ``n_power_iterations`` for spectral norm).

    Returns:
        The qualified names of the submodules that were parametrised ("" for ``module``).

    Raises:
        ValueError: an unknown ``kind``; a selection that matches no layer.
    """
    if kind not in NORM_KINDS:
        raise ValueError(
            f"apply_norm: unknown kind {kind!r}; valid kinds: {', '.join(NORM_KINDS)}"
        )
    done = []
    for name, sub in module.named_modules():
        if not isinstance(sub, _NORMALISED) or parametrize.is_parametrized(sub, "weight"):
            continue
        if include is not None and not any(key in name for key in include):
            continue
        if any(key in name for key in exclude):
            continue
        NORM_KINDS[kind](sub, name="weight", **options)
        done.append(name)
    if not done:
        raise ValueError(
            f"apply_norm({kind!r}): no unnormalised nn.Linear / nn.Conv layer matched "
            f"(include={include!r}, exclude={list(exclude)!r})"
        )
    logger.debug("apply_norm(%s) on %s", kind, done)
    return done


def remove_norm(module: nn.Module) -> list[str]:
    """Replace every parametrised ``weight`` under ``module`` by a plain parameter holding its
    current (normalised) value; returns the qualified names of the layers changed."""
    done = []
    for name, sub in module.named_modules():
        if parametrize.is_parametrized(sub, "weight"):
            parametrize.remove_parametrizations(sub, "weight", leave_parametrized=True)
            done.append(name)
    return done
