"""Finding the implicit layers of a model: the submodules that carry a backward mode, and
``ImplicitLayer``, the attributes that make a custom layer visible to the diagnostics."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from torch import nn

from implicit_ham.adjoints.modes import Adjoint

ROOT = "(root)"


@runtime_checkable
class ImplicitLayer(Protocol):
    """What ``find_implicit_layers``, ``DiagnosticsCallback``, ``GuardedStep`` and
    ``compare_adjoints`` read from a layer (an ``nn.Module``; every ``ih.Decomposition`` is one).

    Attributes:
        adjoint: its backward mode (an ``Adjoint`` or a registry name). Required: it is what
            makes a module an implicit layer (``find_implicit_layers``), whose output and input
            gradient norms the callback logs, and whose mode ``compare_adjoints`` switches.
        last_solution: the ``Solution`` of its latest forward (``value`` detached, ``stats``,
            ``backward_log``), or None. Without it the callback logs no solver / backward
            statistics for the layer and ``GuardedStep`` sees none of its failures.

    Optional method: ``implicit_problem(*inputs) -> FixedPointProblem`` (the problem its
    forward solves for those inputs), which lets the callback estimate the conditioning of
    ``I - J`` at ``last_solution.value``.
    """

    adjoint: Adjoint | str
    last_solution: Any


def find_implicit_layers(model: nn.Module) -> dict[str, nn.Module]:
    """The submodules (the model itself included) that are implicit layers: they carry an
    ``adjoint`` attribute holding an ``Adjoint`` or its registry name (see ``ImplicitLayer``
    for what else the diagnostics read). Keys are module names (``ROOT`` for the model
    itself)."""
    return {
        name or ROOT: module
        for name, module in model.named_modules()
        if isinstance(getattr(module, "adjoint", None), (Adjoint, str))
    }
