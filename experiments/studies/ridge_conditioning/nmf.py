"""Conditioning of NMF posed as an argmin (``RidgeNMF``) vs NMF's multiplicative-update fixed
point (issue 18, item 4). CPU, float64, about 30 s.

For a non-negative X (12 x 20, rank 3) built from dense positive factors and from sparse ones
(half the entries zero), both plus a little positive noise:

* NMF (multiplicative updates, 20 000 steps): κ(I − J) of the update at the reached point and the
  number of singular values of I − J below 1e-6 of the largest (the symmetry's zero modes);
* RidgeNMF (projected gradient on ``||X − D Cᵀ||² + lam (||D||² + ||C||²)``, 40 000 steps) for
  lam = 0.01 and 0.1: the same for its projected-gradient map, and κ of the Hessian of the
  regularised loss on the free (non-zero) entries, with its near-zero eigenvalues.

J and the Hessian are dense (``torch.func.jacrev`` / ``hessian``).

    python -m experiments.studies.ridge_conditioning.nmf
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

import implicit_ham as ih
from implicit_ham.decompositions.base import State

F64 = torch.float64
ZERO_MODE = 1e-6


def nmf_problem(sparse: bool, d: int = 12, n: int = 20, r: int = 3, seed: int = 0):
    """X (1, d, n) = W Hᵀ + 0.01 U[0, 1) and unit-norm random initial bases (1, d, r)."""
    gen = torch.Generator().manual_seed(seed)
    w, h = torch.rand(d, r, generator=gen, dtype=F64), torch.rand(n, r, generator=gen, dtype=F64)
    if sparse:
        w = w * (torch.rand(d, r, generator=gen, dtype=F64) < 0.5)
        h = h * (torch.rand(n, r, generator=gen, dtype=F64) < 0.5)
    x = (w @ h.T + 0.01 * torch.rand(d, n, generator=gen, dtype=F64))[None]
    bases = torch.rand(1, d, r, generator=gen, dtype=F64)
    return x, bases / bases.norm(dim=1, keepdim=True)


def solve(layer: ih.Decomposition, x: Tensor, bases: Tensor, steps: int) -> State:
    """``steps`` iterations of the layer's map from its initial state (D, C)."""
    state = layer.init(x, bases)
    with torch.no_grad():
        for _ in range(steps):
            state = layer.step(x, state)
    return state


def flat(fn: Callable[[State], Tensor], state: State) -> tuple[Callable[[Tensor], Tensor], Tensor]:
    """``fn`` on the state (D, C) flattened to one vector, and that vector."""
    (d, c), sizes = state, [t.numel() for t in state]

    def on_vector(v: Tensor) -> Tensor:
        v_d, v_c = torch.split(v, sizes)
        return fn((v_d.reshape(d.shape), v_c.reshape(c.shape)))

    return on_vector, torch.cat([t.reshape(-1) for t in state])


def measure(layer: ih.Decomposition, x: Tensor, bases: Tensor, steps: int, hessian: bool) -> dict:
    """Residual, zeros, κ(I − J) and its zero modes; with ``hessian`` also κ(H_free)."""
    state = solve(layer, x, bases, steps)
    step, v = flat(lambda s: torch.cat([t.reshape(-1) for t in layer.step(x, s)]), state)
    sv = torch.linalg.svdvals(torch.eye(len(v), dtype=F64) - torch.func.jacrev(step)(v))
    row = {
        "rel_residual": float((step(v) - v).norm() / v.norm()),
        "zeros": f"{int((v == 0).sum())}/{len(v)}",
        "kappa_I_minus_J": float(sv[0] / sv[-1]),
        "zero_modes_I_minus_J": int((sv < ZERO_MODE * sv[0]).sum()),
    }
    if hessian:
        loss, _ = flat(lambda s: layer.objective(x, s).sum(), state)
        free = v > 0
        eig = torch.linalg.eigvalsh(torch.func.hessian(loss)(v)[free][:, free])
        row["kappa_hessian_free"] = float(eig[-1] / eig[0].abs())
        row["zero_modes_hessian"] = int((eig.abs() < ZERO_MODE * eig[-1]).sum())
    return row


def main() -> None:
    for sparse in (False, True):
        x, bases = nmf_problem(sparse)
        print("sparse factors" if sparse else "dense positive factors")
        rows = [("NMF (multiplicative updates)", measure(ih.NMF(rank=3), x, bases, 20000, False))]
        for lam in (0.01, 0.1):
            layer = ih.RidgeNMF(rank=3, lam=lam)
            rows.append((f"RidgeNMF lam={lam:g}", measure(layer, x, bases, 40000, True)))
        for name, row in rows:
            print(f"  {name}: " + ", ".join(f"{k}={_fmt(v)}" for k, v in row.items()))


def _fmt(value: object) -> str:
    return f"{value:.2e}" if isinstance(value, float) else str(value)


if __name__ == "__main__":
    main()
