"""Conditioning of CD posed as an argmin (``RidgeCD``) vs CD's plain fixed point (issue 18,
item 4; the sibling of ``ridge_nmf_conditioning``). CPU, float64, a few seconds.

For X (1, 12, 40), rank 3, at CD's ``inv_t = 100`` and at ``inv_t = 1`` (the official HamNet
settings), from two kinds of input:

* "clustered": pixels = one of 3 random unit directions + 0.3 N(0, 1) noise, norms U[0.5, 2);
* "gaussian": i.i.d. N(0, 1) pixels (no cluster structure),

and the same unit-norm random initial bases:

* CD (its iteration, 500 steps): κ(I − J) of the map on the whole state (D, C) and of its
  D block ``A = ∂D'/∂D``, the spectral radius of A, and the singular values of I − J below
  1e-6 of the largest (zero modes);
* RidgeCD for lam = 0.5, 1, 2 (its exact block steps, 2 000 steps, ``eps`` = 1e-300 so that the
  point is exactly stationary): the same, κ of the Hessian H of Psi at the reached point with
  its smallest eigenvalue (> 0: a minimum), and ``max |(I − A) − P⁻¹H|``, ``P = lam diag(pi_k)``,
  which the construction makes zero;
* for both, the concepts' norms and the smallest distance between two concepts over the
  largest norm (0: collapsed concepts).

J and H are dense (``torch.func.jacrev`` / ``hessian``).

    python -m experiments.studies.ridge_conditioning.cd
"""

from __future__ import annotations

import torch
from torch import Tensor

import implicit_ham as ih
from experiments.studies.ridge_conditioning.nmf import ZERO_MODE, _fmt, flat, solve

F64 = torch.float64
CD_STEPS, RIDGE_STEPS = 500, 2000
LAMS = (0.5, 1.0, 2.0)
INV_TS = (100.0, 1.0)  # CD's class default; the HamNet settings' INV_T


def cd_problem(clustered: bool, d: int = 12, n: int = 40, r: int = 3, seed: int = 0):
    """X (1, d, n) (see the module docstring) and unit-norm random initial bases (1, d, r)."""
    gen = torch.Generator().manual_seed(seed)
    if clustered:
        centres = torch.randn(d, r, generator=gen, dtype=F64)
        centres = centres / centres.norm(dim=0)
        labels = torch.arange(n) % r
        x = centres[:, labels] + 0.3 * torch.randn(d, n, generator=gen, dtype=F64)
        x = x / x.norm(dim=0) * (0.5 + 1.5 * torch.rand(n, generator=gen, dtype=F64))
    else:
        x = torch.randn(d, n, generator=gen, dtype=F64)
    bases = torch.randn(1, d, r, generator=gen, dtype=F64)
    return x[None], bases / bases.norm(dim=1, keepdim=True)


def measure(layer: ih.CD, x: Tensor, bases: Tensor, steps: int) -> dict[str, object]:
    """Residual, κ(I − J) (whole state and D block), spectral radius of the D block, zero
    modes; for a ``RidgeCD`` also κ(H), H's smallest eigenvalue and ``(I − A) − H / lam``."""
    state = solve(layer, x, bases, steps)
    step, v = flat(lambda s: torch.cat([t.reshape(-1) for t in layer.step(x, s)]), state)
    jac = torch.func.jacrev(step)(v)
    eye = torch.eye(len(v), dtype=F64)
    sv = torch.linalg.svdvals(eye - jac)
    nd = state[0].numel()
    block = jac[:nd, :nd]  # A = dD'/dD (the map ignores the incoming C)
    sv_d = torch.linalg.svdvals(torch.eye(nd, dtype=F64) - block)
    row: dict[str, object] = {
        "rel_residual": float((step(v) - v).norm() / v.norm()),
        "kappa_I_minus_J": float(sv[0] / sv[-1]),
        "kappa_I_minus_A": float(sv_d[0] / sv_d[-1]),
        "rho_A": float(torch.linalg.eigvals(block).abs().max()),
        "zero_modes_I_minus_J": int((sv < ZERO_MODE * sv[0]).sum()),
    }
    concepts = state[0][0]
    gaps = torch.cdist(concepts.T, concepts.T).fill_diagonal_(torch.inf)
    row["concept_norms"] = "/".join(f"{v:.2f}" for v in concepts.norm(dim=0).tolist())
    row["min_gap"] = float(gaps.min() / concepts.norm(dim=0).max())
    if isinstance(layer, ih.RidgeCD):
        shape = state[0].shape

        def psi(d: Tensor) -> Tensor:
            return layer.objective(x, (d.reshape(shape), state[1])).sum()

        hess = torch.func.hessian(psi)(state[0].reshape(-1))
        eig = torch.linalg.eigvalsh(hess)
        norms = x[0].norm(dim=0)
        masses = (state[1][0] * norms[:, None]).sum(dim=0) / norms.sum()  # pi_k (r,)
        precondition = (layer.lam * masses).repeat(shape[1])  # D flattened row-major (d, r)
        row["kappa_hessian"] = float(eig[-1] / eig[0].abs())
        row["min_eig_hessian"] = float(eig[0])
        row["max_err_I_minus_A_vs_P_inv_H"] = float(
            (torch.eye(nd, dtype=F64) - block - hess / precondition[:, None]).abs().max()
        )
    return row


def main() -> None:
    for inv_t in INV_TS:
        for clustered in (True, False):
            x, bases = cd_problem(clustered)
            print(f"{'clustered' if clustered else 'gaussian'} pixels, inv_t={inv_t:g}")
            cd = ih.CD(rank=3, inv_t=inv_t)
            rows = [("CD (its iteration)", measure(cd, x, bases, CD_STEPS))]
            for lam in LAMS:
                layer = ih.RidgeCD(rank=3, lam=lam, inv_t=inv_t, eps=1e-300)
                rows.append((f"RidgeCD lam={lam:g}", measure(layer, x, bases, RIDGE_STEPS)))
            for name, row in rows:
                print(f"  {name}: " + ", ".join(f"{k}={_fmt(v)}" for k, v in row.items()))


if __name__ == "__main__":
    main()
