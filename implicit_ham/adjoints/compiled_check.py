"""The fixed-point check of a compiled forward pass, run eagerly.

Imported by ``func_gradient`` only while ``torch.compile`` traces (``torch.compiler.disable``
imports ``torch._dynamo``, which ``import implicit_ham`` must not pay for).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from implicit_ham.adjoints.func_gradient import TransformedSolve


@torch.compiler.disable
def check_outside_the_graph(solve: TransformedSolve, residual: Tensor) -> None:
    """The fixed-point check of a compiled forward pass, run eagerly (one graph break): it
    warns or raises per ``on_divergence`` (the compiled backward cannot branch on it)."""
    solve.go_on(float(residual.max()) if residual.numel() else 0.0)
