"""``jacobian_penalty``: the Jacobian regulariser of DEQ training (Bai et al., 2021).

A Hutchinson estimate of ``||df/dz||_F^2 / z.numel()`` at a point z, from vector-Jacobian
products with Gaussian vectors (``E ||v^T J||^2 = ||J||_F^2`` for ``v ~ N(0, I)``), built with
``create_graph=True`` so that adding ``weight * penalty`` to the loss trains ``f``'s parameters
and ``args`` towards a smaller Jacobian, i.e. a more contractive map. The normalisation by the
number of state entries is TorchDEQ's (``jac_reg``), so weights carry over.

Cost: one evaluation of ``f`` at z plus one vector-Jacobian product per sample (with its graph
kept for the loss's backward pass, which then costs about one more VJP per sample).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from implicit_ham._core.state import StateSpec


def jacobian_penalty(
    f: Callable[..., Tensor | Sequence[Tensor]],
    z: Tensor | Sequence[Tensor],
    *args: Any,
    samples: int = 1,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Hutchinson estimate of ``||df/dz (z)||_F^2 / numel(z)``, differentiable.

    Args:
        f: the map ``f(z, *args) -> z'`` of the fixed-point layer (same structure as z).
        z: the point, typically the solution ``sol.value``: a (B, ...) Tensor or a tuple of
            them. It is detached: the penalty trains ``f`` (its parameters and ``args``), it
            does not differentiate through the solve that produced z.
        *args: the inputs of ``f`` after z.
        samples: number of Gaussian probe vectors averaged (>= 1).
        generator: draws the probe vectors (default: the global generator).

    Returns:
        0-d tensor ``mean_k ||v_k^T J||^2 / numel(z)`` in z's dtype, with a graph to ``f``'s
        parameters and ``args``.

    Raises:
        ValueError: ``samples < 1``, or ``f(z)`` does not depend on z (no Jacobian to penalise).
        RuntimeError: called with gradient disabled (the penalty exists to be trained).
    """
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise ValueError(f"jacobian_penalty: samples must be an int >= 1, got {samples!r}")
    if not torch.is_grad_enabled():
        raise RuntimeError(
            "jacobian_penalty needs gradient enabled (it builds a graph to train f); call it "
            "outside torch.no_grad() / inference_mode()"
        )
    spec = StateSpec.of(z)
    point = tuple(t.detach().requires_grad_(True) for t in spec.as_tuple(z))
    out = spec.check(f(spec.restore(point), *args), where="jacobian_penalty")
    unused = (
        "jacobian_penalty: f(z) does not depend on z with gradient (its output has no graph "
        "to z: f ignores z, or detaches it), so there is no Jacobian to penalise; pass the "
        "layer's map f, not its output, and keep z in f's graph"
    )
    out_probes = [t for t in out if t.requires_grad]
    if not out_probes:
        raise ValueError(unused)
    numel = sum(t.numel() for t in point)
    total = point[0].new_zeros(())
    for _ in range(samples):
        probes = tuple(
            torch.randn(t.shape, dtype=t.dtype, device=t.device, generator=generator)
            for t in out_probes
        )
        vjps = torch.autograd.grad(
            out_probes, point, probes, create_graph=True, retain_graph=True, allow_unused=True
        )
        if all(g is None for g in vjps):  # a graph to f's parameters only, none to z
            raise ValueError(unused)
        total = total + sum(g.square().sum() for g in vjps if g is not None)
    return total / (samples * numel)
