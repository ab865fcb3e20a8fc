"""The Moré-Garbow-Hillstrom set (``implicit_ham.testing.mgh``) through ``ih.least_squares`` /
``ih.minimize`` at their defaults and through SciPy's ``least_squares`` (lm, trf) and
``minimize`` (BFGS, L-BFGS-B, Newton-CG), in float64 and float32.

Each run gives one row: the problem, the method, the dtype, the final ``f = Σ r²`` (evaluated in
float64 at the returned point), whether it is solved (Moré & Wild's ``f - f* <= tau (f0 - f*)``,
tau = ``TAU[dtype]``), whether it stopped at another stated minimum, the evaluations
(ours: calls of the residual function, Jacobians included, each call one batched evaluation;
SciPy: ``nfev`` / ``njev`` as it reports them; its Jacobians, gradients and Hessian-vector
products come from torch autograd of the same residuals) and the wall time.

SciPy runs in float64 only (its solvers work in float64 whatever the input dtype).
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
from scipy import optimize
from torch import Tensor

import implicit_ham as ih
from implicit_ham.testing.mgh import MGHProblem, problems, solved

TAU = {torch.float64: 1e-6, torch.float32: 1e-4}
OURS = (
    "ours least_squares (GaussNewton)",
    "ours least_squares (LevenbergMarquardt)",
    "ours minimize (LBFGS)",
    "ours minimize (NewtonCG)",
)
SCIPY = ("scipy lm", "scipy trf", "scipy BFGS", "scipy L-BFGS-B", "scipy Newton-CG")


@dataclass(frozen=True)
class Row:
    """One (problem, method, dtype) run."""

    problem: str
    number: int
    n: int
    method: str
    dtype: str
    f: float
    fstar: float
    solved: bool
    local: bool
    evaluations: int
    jacobians: int
    seconds: float
    note: str = ""


def _counted(fn: Callable[[Tensor], Tensor], counter: list[int]) -> Callable[[Tensor], Tensor]:
    def wrapped(x: Tensor) -> Tensor:
        counter[0] += 1
        return fn(x)

    return wrapped


def _run_ours(p: MGHProblem, method: str, dtype: torch.dtype) -> tuple[Tensor, int, str]:
    counter = [0]
    residuals = _counted(p.residuals, counter)
    x0 = p.start(dtype)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        solver: ih.plugins.Minimizer
        if "least_squares" in method:
            solver = ih.GaussNewton() if "GaussNewton" in method else ih.LevenbergMarquardt()
            value = ih.least_squares(residuals, x0, solver=solver).value
        else:
            solver = ih.LBFGS() if "LBFGS" in method else ih.NewtonCG()
            value = ih.minimize(lambda x: (residuals(x) ** 2).sum(-1), x0, solver=solver).value
    assert isinstance(value, Tensor)
    note = "; ".join(sorted({f"{w.category.__name__}: {str(w.message)[:160]}" for w in caught}))
    return value.detach(), counter[0], note


def _numpy_fns(p: MGHProblem) -> dict[str, Callable[..., Any]]:
    def t(v: np.ndarray) -> Tensor:
        return torch.tensor(v, dtype=torch.float64)[None]

    def f(v: np.ndarray) -> float:
        return float(p.f(t(v)))

    def grad(v: np.ndarray) -> np.ndarray:
        x = t(v).requires_grad_()
        return torch.autograd.grad(p.f(x).sum(), x)[0][0].numpy()

    def hessp(v: np.ndarray, d: np.ndarray) -> np.ndarray:
        _, hv = torch.autograd.functional.hvp(lambda x: p.f(x).sum(), t(v), t(d))
        return hv[0].numpy()

    def res(v: np.ndarray) -> np.ndarray:
        return p.residuals(t(v))[0].numpy()

    def jac(v: np.ndarray) -> np.ndarray:
        return torch.func.jacrev(lambda x: p.residuals(x[None])[0])(t(v)[0]).numpy()

    return {"f": f, "grad": grad, "hessp": hessp, "res": res, "jac": jac}


def _run_scipy(p: MGHProblem, method: str) -> tuple[np.ndarray, int, int, str]:
    fns, x0 = _numpy_fns(p), np.array(p.x0, dtype=np.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if method in ("scipy lm", "scipy trf"):
            out = optimize.least_squares(fns["res"], x0, jac=fns["jac"], method=method[6:])
            return out.x, int(out.nfev), int(out.njev or 0), str(out.message)[:120]
        kwargs: dict[str, Any] = {"jac": fns["grad"]}
        if method == "scipy Newton-CG":
            kwargs["hessp"] = fns["hessp"]
        out = optimize.minimize(fns["f"], x0, method=method[6:], **kwargs)
        return out.x, int(out.nfev), int(getattr(out, "njev", 0) or 0), str(out.message)[:120]


def _row(
    p: MGHProblem,
    method: str,
    dtype: torch.dtype,
    x: Tensor,
    evaluations: int,
    jacobians: int,
    seconds: float,
    note: str,
) -> Row:
    f = float(p.f(x.to(torch.float64)))
    f0 = float(p.f(p.start()))
    tau = TAU[dtype]
    is_solved = solved(f, f0, p.fstar, tau)
    local = not is_solved and any(solved(f, f0, m, tau) for m in p.local)
    return Row(
        p.name,
        p.number,
        p.n,
        method,
        str(dtype).replace("torch.", ""),
        f,
        p.fstar,
        is_solved,
        local,
        evaluations,
        jacobians,
        seconds,
        note,
    )


def run(dtypes: tuple[torch.dtype, ...] = (torch.float64, torch.float32)) -> list[Row]:
    """Every problem through every method (ours in each dtype, SciPy in float64)."""
    rows: list[Row] = []
    for p in problems():
        for dtype in dtypes:
            for method in OURS:
                start = time.perf_counter()
                try:
                    x, evaluations, note = _run_ours(p, method, dtype)
                except Exception as err:  # a refusal is a result: recorded, not solved
                    x, evaluations, note = (
                        p.start(dtype) * math.nan,
                        0,
                        f"raised {type(err).__name__}: {err}"[:200],
                    )
                rows.append(
                    _row(p, method, dtype, x, evaluations, 0, time.perf_counter() - start, note)
                )
        for method in SCIPY:
            start = time.perf_counter()
            xs, nfev, njev, message = _run_scipy(p, method)
            x = torch.tensor(xs, dtype=torch.float64)[None]
            rows.append(
                _row(p, method, torch.float64, x, nfev, njev, time.perf_counter() - start, message)
            )
    return rows


def as_dicts(rows: list[Row]) -> list[dict[str, Any]]:
    """The rows as JSON-ready dictionaries."""
    return [asdict(r) for r in rows]
