"""``attribute_events(model)``: count the event ledger's events per implicit layer of a model,
in plain PyTorch training code (``GuardedStep`` has its own per-layer failure monitor)."""

from __future__ import annotations

from torch import nn

from implicit_ham._core.events import EventLabels, label_layers
from implicit_ham.adjoints.layers import find_implicit_layers


def attribute_events(model: nn.Module) -> EventLabels:
    """Label every implicit layer of ``model`` (``find_implicit_layers``: the submodules with an
    ``adjoint``) with its qualified name, so that ``ih.diagnostics.events().counts()`` counts
    their forward and backward events per layer (``label_events``; the model itself is
    "(root)"). A model without implicit layers gets no hooks.

    Returns:
        The handle: ``remove()`` (or a ``with`` block) takes the hooks off.
    """
    return label_layers(find_implicit_layers(model))
