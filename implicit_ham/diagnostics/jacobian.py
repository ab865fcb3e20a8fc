"""The Jacobian ``J = df/dz`` at a fixed point as matrix-free products on flat vectors.

Diagnostics never form J: they see it through ``jvp(v) = J v`` and ``vjp(u) = J^T u`` on the
whole batch flattened to one vector of length M = B * N (as the implicit backward pass does, so
samples coupled inside ``f`` are handled correctly; for independent samples J is block diagonal).

Two backends compute the products:

* ``"func"``: ``torch.func.jvp`` (forward mode, one evaluation of ``f`` per product) and
  ``torch.func.vjp`` (its pullback is computed once and reused), under ``torch.no_grad`` so no
  graph reaches the parameters ``f`` closes over;
* ``"autograd"``: ``f`` is evaluated once with gradient; VJPs reuse that graph and JVPs use the
  double-backward identity ``J v = d/du <J^T u, v>``. Works for any ``f`` that autograd can
  differentiate twice, including old-style ``autograd.Function``s that ``torch.func`` rejects.

``"auto"`` tries ``"func"`` and falls back to ``"autograd"`` when ``torch.func`` cannot transform
``f`` (e.g. data-dependent control flow, a custom Function without ``setup_context``).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from implicit_ham._core.state import StateSpec
from implicit_ham._core.validation import check_choice

logger = logging.getLogger(__name__)

BACKENDS = ("auto", "func", "autograd")


class FixedPointJacobian:
    """``J = df/dz`` at ``z_star`` for ``f(z, *args)``, as JVPs and VJPs on (M,) vectors.

    Args:
        f: ``f(z, *args) -> z'``, z a Tensor (B, ...) or a tuple of them.
        z_star: the point to linearise at (normally a fixed point), same structure as ``f``'s z.
        *args: the other inputs of ``f``; tensors are detached (held constant).
        backend: "auto", "func" or "autograd" (see the module docstring).

    Attributes:
        size: M, the number of entries of the whole batch's state.
        fz: (M,) ``f(z_star)`` flattened, to measure the fixed-point residual.
        backend: the backend in use.
        calls: products computed so far (JVPs and VJPs).
    """

    def __init__(
        self,
        f: Callable[..., Any],
        z_star: Tensor | Sequence[Tensor],
        *args: Any,
        backend: str = "auto",
    ) -> None:
        check_choice("FixedPointJacobian", "backend", backend, BACKENDS)
        self.spec = StateSpec.of(z_star)
        z_flat = self.spec.flatten(tuple(t.detach() for t in self.spec.as_tuple(z_star)))
        consts = tuple(a.detach() if isinstance(a, Tensor) else a for a in args)

        def flat_f(x: Tensor) -> Tensor:
            z = self.spec.restore(self.spec.unflatten(x.reshape(self.spec.batch, -1)))
            out = self.spec.check(f(z, *consts), where="FixedPointJacobian")
            return self.spec.flatten(out).reshape(-1)

        self.z_star = z_flat.reshape(-1)
        self.size = self.z_star.numel()
        self.calls = 0
        if backend in ("auto", "func"):
            try:
                self._init_func(flat_f)
                self.backend = "func"
                return
            except (RuntimeError, NotImplementedError, TypeError) as err:
                if backend == "func":
                    raise RuntimeError(
                        f"torch.func cannot transform f ({err}); use backend='autograd'"
                    ) from err
                logger.info("torch.func cannot transform f (%s); using the autograd backend", err)
        self._init_autograd(flat_f)
        self.backend = "autograd"

    def _init_func(self, flat_f: Callable[[Tensor], Tensor]) -> None:
        z = self.z_star
        with torch.no_grad(), warnings.catch_warnings():
            # torch's first forward-mode call scripts its JVP decompositions and warns that
            # torch.jit.script is deprecated: torch-internal noise, not the user's concern.
            warnings.filterwarnings(
                "ignore", message=".*torch.jit.script", category=DeprecationWarning
            )
            fz, vjp_fn = torch.func.vjp(flat_f, z)[:2]  # (output, pullback) without has_aux
            torch.func.jvp(flat_f, (z,), (torch.zeros_like(z),))
        self.fz = fz.detach()
        self._jvp: Callable[[Tensor], Tensor] = lambda v: torch.func.jvp(flat_f, (z,), (v,))[1]
        self._vjp: Callable[[Tensor], Tensor] = lambda u: vjp_fn(u)[0]

    def _init_autograd(self, flat_f: Callable[[Tensor], Tensor]) -> None:
        with torch.enable_grad():
            z_req = self.z_star.detach().clone().requires_grad_()
            fz = flat_f(z_req)
        self.fz = fz.detach()
        if fz.grad_fn is None:
            zeros = torch.zeros_like(self.z_star)
            self._jvp = self._vjp = lambda _: zeros
            return

        def vjp(u: Tensor, create_graph: bool = False) -> Tensor:
            (g,) = torch.autograd.grad(
                fz, z_req, u, retain_graph=True, create_graph=create_graph, allow_unused=True
            )
            return torch.zeros_like(u) if g is None else g

        def jvp(v: Tensor) -> Tensor:
            with torch.enable_grad():
                u = torch.zeros_like(v, requires_grad=True)
                g = vjp(u, create_graph=True)
                if g.grad_fn is None:
                    return torch.zeros_like(v)
                (jv,) = torch.autograd.grad(g, u, v, allow_unused=True)
            return torch.zeros_like(v) if jv is None else jv

        self._jvp, self._vjp = jvp, vjp

    def jvp(self, v: Tensor) -> Tensor:
        """(M,) -> (M,): ``J v``."""
        self.calls += 1
        with torch.no_grad() if self.backend == "func" else torch.enable_grad():
            return self._jvp(v).detach()

    def vjp(self, u: Tensor) -> Tensor:
        """(M,) -> (M,): ``J^T u``."""
        self.calls += 1
        with torch.no_grad() if self.backend == "func" else torch.enable_grad():
            return self._vjp(u).detach()

    def residual(self) -> float:
        """``||f(z*) - z*|| / ||z*||`` over the whole batch: how far z* is from a fixed point."""
        diff = float(torch.linalg.vector_norm(self.fz - self.z_star))
        scale = float(torch.linalg.vector_norm(self.z_star))
        return diff / scale if scale > 0 else diff
