"""What a peer case is, and the references the cases share: central finite differences of a
solve along random directions, and the error measures the peers' assertions use.

A ``PeerCase`` carries one assertion of a peer library's own test suite over to this library:
the problem, the inputs, the expected values and the tolerance are the peer's (facts; the code
is written anew); ``body`` runs it against the matching layer here and returns its measured
numbers (``require`` fails it with them). A case without a counterpart has no body and says
why in ``reason``; a case that takes a plug-in minimizer (``takes_minimizer``) runs with the
peer's solver replaced by the one ``check_minimizer(..., suite="peers")`` is handed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from implicit_ham.problems.fixed_point import Solution
from implicit_ham.solvers.minimizers import Minimizer
from implicit_ham.testing.report import require

Body = Callable[[Minimizer | None], dict[str, float]]
F64 = torch.float64


@dataclass(frozen=True)
class PeerCase:
    """One ported (or not applicable) assertion of a peer's test suite.

    Attributes:
        peer: "theseus", "jaxopt", "optimistix" or "torchopt".
        source: the peer's test file and test, e.g. "tests/anderson_test.py::test_rotation_map".
        name: a short unique id.
        body: runs the case (the argument: a plug-in minimizer, or None for the peer's own
            solver mapped to ours); None when the case is not applicable.
        reason: how the case is mapped (ported) or why it does not apply (no body).
        takes_minimizer: whether a plug-in minimizer can replace the solver.
        loss_only: the case minimises a general loss (``minimize``), so a minimizer that needs
            residuals does not apply to it.
        slow: the case takes several seconds (the test suite marks it ``slow``).
        expected_failure: a known defect the case exposes (it is expected to fail until the
            fix lands; the text names the fix and the numbers).
    """

    peer: str
    source: str
    name: str
    body: Body | None
    reason: str
    takes_minimizer: bool = False
    expected_failure: str = ""
    slow: bool = False
    loss_only: bool = False

    @property
    def applicable(self) -> bool:
        """Whether the case has a counterpart here."""
        return self.body is not None

    @property
    def source_file(self) -> str:
        """The peer's test file."""
        return self.source.split("::")[0]


def one(solution: Solution) -> Tensor:
    """The value of a solution whose state is one tensor."""
    value = solution.value
    assert isinstance(value, Tensor), "a single-tensor state was expected"
    return value


def many(solution: Solution) -> tuple[Tensor, ...]:
    """The value of a solution whose state is a tuple of tensors."""
    value = solution.value
    assert isinstance(value, tuple), "a tuple state was expected"
    return value


def not_applicable(peer: str, source: str, name: str, reason: str) -> PeerCase:
    """A case listed with the reason it has no counterpart."""
    return PeerCase(peer, source, name, None, reason)


def directional_error(
    solve: Callable[..., Tensor],
    inputs: Sequence[Tensor],
    eps: float,
    directions: int = 2,
    seed: int = 0,
    reference: Callable[..., Tensor] | None = None,
) -> float:
    """The worst gap between the autograd derivative of ``<w, solve(*inputs)>`` along random
    input directions d and the central difference ``(s(x + eps d) - s(x - eps d)) / 2 eps``.

    ``inputs`` are float64 tensors (any shapes); ``solve`` returns a tensor. The gap of one
    direction is ``|fd - autograd| / (1 + |fd|)``: ``allclose`` with atol = rtol, the form of
    ``jax.test_util.check_grads`` (jaxopt) and optimistix's ``tree_allclose``; the worst
    direction's gap is returned. ``reference`` (default ``solve``) is the solve the
    differences are taken of: the same problem solved to a tight tolerance, so that the
    differences measure the derivative rather than the forward solve's stopping noise.
    """
    reference = solve if reference is None else reference
    gen = torch.Generator().manual_seed(seed)
    leaves = [x.detach().clone().requires_grad_() for x in inputs]
    out = solve(*leaves)
    w = torch.randn(out.shape, generator=gen, dtype=out.dtype)
    grads = torch.autograd.grad((w * out).sum(), leaves, allow_unused=True)
    worst = 0.0
    for _ in range(directions):
        ds = [torch.randn(x.shape, generator=gen, dtype=x.dtype) for x in inputs]
        auto = sum(float((g * d).sum()) for g, d in zip(grads, ds, strict=True) if g is not None)
        with torch.no_grad():
            plus = reference(*[x.detach() + eps * d for x, d in zip(inputs, ds, strict=True)])
            minus = reference(*[x.detach() - eps * d for x, d in zip(inputs, ds, strict=True)])
        fd = float((w * (plus - minus)).sum()) / (2 * eps)
        worst = max(worst, abs(fd - auto) / (1 + abs(fd)))
    return worst


def fd_jacobian(solve: Callable[[Tensor], Tensor], x: Tensor, eps: float) -> Tensor:
    """The central-difference Jacobian (out.numel(), x.numel()) of ``solve`` at ``x``."""
    cols = []
    flat = x.detach().reshape(-1)
    for i in range(flat.numel()):
        step = torch.zeros_like(flat)
        step[i] = eps
        with torch.no_grad():
            plus = solve((flat + step).reshape(x.shape)).reshape(-1)
            minus = solve((flat - step).reshape(x.shape)).reshape(-1)
        cols.append((plus - minus) / (2 * eps))
    return torch.stack(cols, 1)


def autograd_jacobian(solve: Callable[[Tensor], Tensor], x: Tensor) -> Tensor:
    """The reverse-mode Jacobian (out.numel(), x.numel()) of ``solve`` at ``x``, row by row."""
    leaf = x.detach().clone().requires_grad_()
    out = solve(leaf).reshape(-1)
    rows = [
        torch.autograd.grad(out[i], leaf, retain_graph=True, allow_unused=True)[0]
        for i in range(out.numel())
    ]
    return torch.stack([torch.zeros_like(leaf) if r is None else r for r in rows]).reshape(
        out.numel(), -1
    )


def require_allclose(
    got: Tensor, expected: Tensor, atol: float, rtol: float, what: str
) -> dict[str, float]:
    """``|got - expected| <= atol + rtol |expected|`` elementwise (numpy's ``allclose``, the
    peers' assertion), else a failed check with the worst gap; returns that gap."""
    got, expected = got.detach().to(F64), expected.detach().to(F64)
    gap = (got - expected).abs()
    excess = float((gap - atol - rtol * expected.abs()).max())
    worst = float(gap.max())
    require(excess <= 0, f"{what}: not within atol={atol:g}, rtol={rtol:g}", max_abs_error=worst)
    return {"max_abs_error": worst}


def grad_check(error: float, tol: float, what: str) -> dict[str, float]:
    """A gradient error within the peer's tolerance, else a failed check; returns it as
    ``grad_error`` (the number the peer page reports)."""
    require(error <= tol, f"{what}: the gradient does not match", grad_error=error, tol=tol)
    return {"grad_error": error, "grad_tol": tol}
