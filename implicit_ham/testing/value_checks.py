"""The value-independence check of ``check_solver``, with a diagnosis when it fails.

The backward mode must never change a solver's forward value. When it does, the size of the
difference and its cause tell a plug-in author what to fix:

* the difference is reported in units of the dtype's machine epsilon (``torch.finfo(dtype).eps``)
  beside the largest magnitude of the value, so a last-bit difference (a few eps) reads as one;
* the same two modes are re-run under ``torch.no_grad()``: a solver that spends its trailing
  ``grad_steps`` with autograd recording and the others without then computes every step
  without it, so bitwise equal values there mean the difference comes from computing in grad
  mode (a kernel that differs when autograd records, e.g. an in-place ``lerp_`` in the no-grad
  steps and an out-of-place formula in the recorded ones), not from logic that depends on
  ``grad_steps``;
* ``f`` itself is evaluated at the value with and without autograd recording: if those differ,
  the panel's own map has grad-mode-dependent kernels (on this machine), and the solver is not
  the cause.
"""

from __future__ import annotations

import torch
from torch import Tensor

from implicit_ham.adjoints.modes import Adjoint
from implicit_ham.problems.fixed_point import fixed_point
from implicit_ham.solvers.base import FixedPointSolver
from implicit_ham.testing.common import Run
from implicit_ham.testing.problems import Problem, as_tuple
from implicit_ham.testing.report import require


def max_abs_diff(a: tuple[Tensor, ...], b: tuple[Tensor, ...]) -> float:
    """The largest entry-wise ``|a - b|`` over the state tensors (0.0 for empty tensors)."""
    pairs = zip(a, b, strict=True)
    return max((float((x - y).detach().abs().max()) for x, y in pairs if x.numel()), default=0.0)


def _scale(value: tuple[Tensor, ...]) -> float:
    return max((float(t.detach().abs().max()) if t.numel() else 0.0 for t in value), default=0.0)


def _bitwise_equal(a: tuple[Tensor, ...], b: tuple[Tensor, ...]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def grad_mode_hint(
    problem: Problem, solver: FixedPointSolver, reference: Adjoint, other: Adjoint
) -> str:
    """Why the two modes' values differ, when the cause is computing in grad mode ("" when it
    is not): see the module docstring."""
    with torch.no_grad():
        a = as_tuple(
            fixed_point(
                problem.f, problem.z0, *problem.args, solver=solver, adjoint=reference
            ).value
        )
        b = as_tuple(
            fixed_point(problem.f, problem.z0, *problem.args, solver=solver, adjoint=other).value
        )
        if not _bitwise_equal(a, b):
            return ""
        plain = problem.step(a)
    with torch.enable_grad():
        recorded = problem.step(tuple(t.detach().requires_grad_() for t in a))
    f_eps = max_abs_diff(plain, recorded) / torch.finfo(problem.dtype).eps
    hint = (
        " Under torch.no_grad() both modes give bitwise equal values, so this is a kernel "
        "difference between grad and no-grad mode: the steps computed while autograd records "
        "(the trailing grad_steps) round differently from the ones computed without it."
    )
    if f_eps > 0:
        return hint + (
            f" f itself differs by {f_eps:.1f} eps between grad and no-grad mode at the value, "
            "so the panel's map, not the solver, chooses a different kernel."
        )
    return hint + (
        " f gives bitwise equal results in both modes, so the solver's own step does: compute "
        "the recorded and the unrecorded steps with the same operations (e.g. no in-place "
        "fused kernel in the no-grad steps only)."
    )


def value_independent(
    problem: Problem,
    solver: FixedPointSolver,
    modes: tuple[Adjoint, Adjoint],
    runs: tuple[Run, Run],
) -> dict[str, float]:
    """Require the values of ``runs`` (solved under ``modes``) bitwise equal; a failure reports
    the difference in eps of the dtype and, when it applies, the grad-mode hint."""
    reference, other = runs
    diff = max_abs_diff(reference.value, other.value)
    eps = torch.finfo(problem.dtype).eps
    measured = {"max_abs_diff": diff, "diff_in_eps": diff / eps}
    if _bitwise_equal(reference.value, other.value):
        return measured
    scale = _scale(reference.value)
    hint = grad_mode_hint(problem, solver, *modes)
    require(
        False,
        f"the value under {other.mode} differs from the value under {reference.mode} by "
        f"{diff:.3e} = {diff / eps:.1f} x eps({problem.dtype}) at values of size <= {scale:.3g} "
        "(the backward mode must never change the forward value)." + hint,
        **measured,
        value_scale=scale,
    )
    return measured
