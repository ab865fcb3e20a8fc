"""TorchOpt (metaopt/torchopt): ``tests/test_implicit.py``.

* iMAML (``test_imaml_solve_normal_cg``, ``test_imaml_solve_inv``, ``test_imaml_module``): a
  linear layer 10 -> 10 (weight ones, bias zeros) as meta-parameters; inner problem
  ``cross_entropy(x W^T + b, y) + ½ ||(W, b) - (W0, b0)||²`` on 3 batches of 8 (x from
  ``randint(0, 1)``, i.e. zeros; y from ``randint(0, 10)``, drawn after the layer's default
  initialisation under ``torch.manual_seed(42)``, as TorchOpt's helpers do); the outer loss is
  the mean of the inner model's outputs on x; 3 outer SGD steps (lr 1e-3), the meta-gradient
  by implicit differentiation (normal CG, inverse, Neumann series). TorchOpt checks its
  parameters against jaxopt's after the 3 steps (``helpers.assert_all_close``).
* ridge regression (``test_rr_solve_cg``, ``test_rr_solve_inv``): 10 features, 4 batches of
  1024 (train x, y; query x, y ~ N(0, 1)), ``½ mean((X w - y)²) + ½ λ ||w||²``, λ ~ U(0, 1), w0
  ~ N(0, 1) (``torch.manual_seed(42)``); the outer loss ``mse(X_q w*, y_q)``; 4 outer SGD
  steps on λ (lr 1e-3); λ compared with jaxopt's.

Here the reference is independent of both: the inner problem solved to its minimum and the
meta-gradient computed densely (``torch.func`` Hessians and a ``torch.linalg.solve``), at
``torch.testing.assert_close``'s default tolerances of the dtype.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor

from implicit_ham.adjoints.modes import Adjoint, Implicit, Neumann
from implicit_ham.problems.minimize import minimize
from implicit_ham.solvers.minimizers import Minimizer
from implicit_ham.solvers.quasi_newton import LBFGS
from implicit_ham.testing.peer_cases.common import (
    F64,
    PeerCase,
    grad_check,
    many,
    not_applicable,
    one,
)
from implicit_ham.testing.report import require

PEER = "torchopt"
SOURCE = "tests/test_implicit.py"
TOLERANCE = {torch.float64: (1e-7, 1e-7), torch.float32: (1.3e-6, 1e-5)}  # (rtol, atol)


def _imaml_data() -> tuple[Tensor, Tensor]:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(42)
        torch.nn.Linear(10, 10)  # the layer's default initialisation draws first
        x = torch.randint(0, 1, (24, 10))
        y = torch.randint(0, 10, (24,))
    return x, y


def _imaml_inner(p: tuple[Tensor, Tensor], W0: Tensor, b0: Tensor, x: Tensor, y: Tensor) -> Tensor:
    W, b = p
    logits = x @ W[0].T + b[0]
    reg = 0.5 * (((W - W0) ** 2).sum() + ((b - b0) ** 2).sum())
    return F.cross_entropy(logits, y) + reg


def _imaml_reference(
    W0: Tensor, b0: Tensor, x: Tensor, y: Tensor, p: tuple[Tensor, Tensor]
) -> Tensor:
    """The dense meta-gradient (flat, 110): ``H^{-1} d outer / d p`` (the regulariser's mixed
    derivative is -I), H the inner Hessian at p."""
    flat = torch.cat([p[0].reshape(-1), p[1].reshape(-1)]).detach()

    def inner(v: Tensor) -> Tensor:
        return _imaml_inner((v[:100].reshape(1, 10, 10), v[100:].reshape(1, 10)), W0, b0, x, y)

    def outer(v: Tensor) -> Tensor:
        return (x @ v[:100].reshape(10, 10).T + v[100:]).mean()

    hessian = torch.func.hessian(inner)(flat)
    return torch.linalg.solve(hessian, torch.func.grad(outer)(flat))


def _imaml(adjoint: Adjoint, dtype: torch.dtype, minimizer: Minimizer | None) -> dict[str, float]:
    x_all, y_all = _imaml_data()
    W0 = torch.ones(1, 10, 10, dtype=dtype)
    b0 = torch.zeros(1, 10, dtype=dtype)
    solver = LBFGS(tol=1e-12 if dtype == F64 else 1e-6) if minimizer is None else minimizer
    rtol, atol = TOLERANCE[dtype]
    worst = 0.0
    for k in range(3):
        x, y = x_all[8 * k : 8 * k + 8].to(dtype), y_all[8 * k : 8 * k + 8]
        W0, b0 = W0.detach().requires_grad_(), b0.detach().requires_grad_()
        sol = minimize(
            _imaml_inner, (W0.detach(), b0.detach()), W0, b0, x, y, solver=solver, adjoint=adjoint
        )
        W, b = many(sol)
        outer = (x @ W[0].T + b[0]).mean()
        gW, gb = torch.autograd.grad(outer, (W0, b0))
        got = torch.cat([gW.reshape(-1), gb.reshape(-1)]).to(F64)
        expected = _imaml_reference(
            W0.detach().to(F64),
            b0.detach().to(F64),
            x.to(F64),
            y,
            tuple(t.detach().to(F64) for t in many(sol)),  # type: ignore[arg-type]
        )
        gap = float(((got - expected).abs() - atol - rtol * expected.abs()).max())
        error = float((got - expected).abs().max() / expected.abs().max())
        require(gap <= 0, f"meta-gradient of batch {k} under {adjoint.name}", rel_error=error)
        worst = max(worst, error)
        with torch.no_grad():  # the outer SGD step, lr 1e-3
            W0, b0 = W0 - 1e-3 * gW, b0 - 1e-3 * gb
    return grad_check(worst, max(rtol, atol), "iMAML meta-gradient")


def _rr_data() -> tuple[Tensor, Tensor, list[tuple[Tensor, ...]]]:
    gen = torch.Generator().manual_seed(42)
    w0, lam = torch.randn(10, generator=gen), torch.rand(1, generator=gen)
    gen = torch.Generator().manual_seed(42)
    draws = [
        torch.randn(shape, generator=gen) for shape in ((4096, 10), (4096,), (4096, 10), (4096,))
    ]
    batches = [tuple(d[1024 * k : 1024 * k + 1024] for d in draws) for k in range(4)]
    return w0, lam, batches


def _ridge_inner(w: Tensor, lam: Tensor, X: Tensor, y: Tensor) -> Tensor:
    return 0.5 * ((w @ X.T - y) ** 2).mean() + 0.5 * lam * (w**2).sum()


def _rr(adjoint: Adjoint, dtype: torch.dtype, minimizer: Minimizer | None) -> dict[str, float]:
    w0, lam0, batches = _rr_data()
    solver = LBFGS(tol=1e-12 if dtype == F64 else 1e-6) if minimizer is None else minimizer
    lam, lam_ref = lam0.to(dtype), lam0.to(F64)
    worst = 0.0
    for X, y, Xq, yq in batches:
        X, y, Xq, yq = (t.to(dtype) for t in (X, y, Xq, yq))
        lam = lam.detach().requires_grad_()
        w = one(
            minimize(_ridge_inner, w0.to(dtype)[None], lam, X, y, solver=solver, adjoint=adjoint)
        )
        (grad,) = torch.autograd.grad(F.mse_loss(w[0] @ Xq.T, yq), lam)
        # the reference: the closed form and its derivative, float64
        X64, y64, Xq64, yq64 = (t.to(F64) for t in (X, y, Xq, yq))
        gram = X64.T @ X64 / len(y64) + lam_ref * torch.eye(10, dtype=F64)
        w_ref = torch.linalg.solve(gram, X64.T @ y64 / len(y64))
        dw = -torch.linalg.solve(gram, w_ref)
        g_ref = (2 * (Xq64 @ w_ref - yq64) @ (Xq64 @ dw)) / len(yq64)
        worst = max(worst, float((grad.to(F64) - g_ref).abs() / g_ref.abs()))
        with torch.no_grad():
            lam, lam_ref = lam - 1e-3 * grad, lam_ref - 1e-3 * g_ref
    rtol, atol = TOLERANCE[dtype]
    gap = float((lam.to(F64) - lam_ref).abs())
    require(gap <= atol + rtol * float(lam_ref.abs()), "λ after 4 outer steps", gap=gap)
    # TorchOpt asserts λ after the 4 steps; the gradient's own gap is reported (CG stops at
    # a relative residual 1e-5, so 1e-3 bounds it loosely)
    return {**grad_check(worst, 1e-3, "d loss / d λ"), "lambda_gap": gap}


def cases() -> list[PeerCase]:
    """TorchOpt's cases (see the module docstring)."""
    out: list[PeerCase] = []
    modes: list[tuple[str, str, Callable[[], Adjoint]]] = [
        ("test_imaml_solve_normal_cg", "cg", lambda: Implicit(linear_solver="cg")),
        ("test_imaml_solve_inv", "inv", lambda: Implicit(linear_solver="dense")),
        ("test_imaml_solve_inv", "neumann", lambda: Neumann(k=100, tau=0.5)),
    ]
    for test, label, mode in modes:
        for dtype, tag in ((F64, "f64"), (torch.float32, "f32")):
            out.append(
                PeerCase(
                    PEER,
                    f"{SOURCE}::{test}",
                    f"imaml_{label}_{tag}",
                    partial(_imaml, mode(), dtype),
                    f"minimize(LBFGS) to the minimum, {mode().name}; solve_{label} -> "
                    f"{mode()!r}; lr / inner_lr / inner_update (TorchOpt's inner SGD) have no "
                    "counterpart: ours solves the inner problem to its minimum, which both sides' "
                    "implicit gradients assume",
                    takes_minimizer=True,
                    loss_only=True,
                    slow=label == "neumann" or (label == "cg" and dtype == F64),
                )
            )
    out.append(
        not_applicable(
            PEER,
            f"{SOURCE}::test_imaml_module",
            "imaml_module",
            "ImplicitMetaGradientModule (an nn.Module whose solve() is differentiated): the "
            "same problem runs as imaml_* through minimize; ih.module_state gives a module's "
            "weights as a state",
        )
    )
    for test, label, mode in (
        ("test_rr_solve_cg", "cg", lambda: Implicit(linear_solver="cg")),
        ("test_rr_solve_inv", "inv", lambda: Implicit(linear_solver="dense")),
    ):
        for dtype, tag in ((F64, "f64"), (torch.float32, "f32")):
            out.append(
                PeerCase(
                    PEER,
                    f"{SOURCE}::{test}",
                    f"rr_{label}_{tag}",
                    partial(_rr, mode(), dtype),
                    f"minimize(LBFGS), {mode()!r}; 4 outer SGD steps on λ against the closed "
                    "form's",
                    takes_minimizer=True,
                    loss_only=True,
                )
            )
    out.append(
        PeerCase(
            PEER,
            f"{SOURCE}::test_rr_solve_inv",
            "rr_neumann_f32",
            partial(_rr, Neumann(k=100, tau=0.5), torch.float32),
            "ns=True (Neumann series) -> Neumann(k=100, tau=0.5); float32 only, as upstream "
            "(which skips float64 with ns)",
            takes_minimizer=True,
            loss_only=True,
            slow=True,
        )
    )
    return out
