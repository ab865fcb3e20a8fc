"""Finding the implicit layers of a model: the submodules that carry a backward mode."""

from __future__ import annotations

from torch import nn

from implicit_ham.adjoints.modes import Adjoint

ROOT = "(root)"


def find_implicit_layers(model: nn.Module) -> dict[str, nn.Module]:
    """The submodules (the model itself included) that are implicit layers: they carry an
    ``adjoint`` attribute holding an ``Adjoint`` or its registry name. Keys are module names
    (``ROOT`` for the model itself)."""
    return {
        name or ROOT: module
        for name, module in model.named_modules()
        if isinstance(getattr(module, "adjoint", None), (Adjoint, str))
    }
