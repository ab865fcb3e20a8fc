"""``check_decomposition``: a ``Decomposition`` layer (class or instance) against the contract,
on a small feature map (2, C, H, W) in float64 (and float32 for the dtype check)."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from functools import partial
from typing import Any

import torch

from implicit_ham._core.errors import NonFiniteError
from implicit_ham.adjoints.modes import (
    Adjoint,
    Implicit,
    Neumann,
    OneStep,
    Phantom,
    Truncated,
    Unroll,
)
from implicit_ham.decompositions import Decomposition
from implicit_ham.testing.common import expect_error, matches_fd
from implicit_ham.testing.decomposition_inputs import (
    build,
    feature_map,
    initial_bases,
    run_layer,
    x_gradient,
)
from implicit_ham.testing.report import Checker, ConformanceReport, NotApplicableError, require

UNROLL_FD_RTOL = 1e-5


def check_decomposition(
    target: type[Decomposition] | Decomposition,
    *,
    exact_unroll: bool | None = None,
    fail_fast: bool = True,
) -> ConformanceReport:
    """Build the layer (a class: ``cls(rank=2, steps=3, eval_steps=3)``; an instance: a deep
    copy) and check it on x (2, C, H, W) (C = 8 per group, H = W = 4 unless the layer needs
    more; uniform in [0.1, 1.1) when ``cls.nonnegative``, else standard normal), in training
    mode, with explicit initial bases so that the runs are comparable.

    Checks:

    * ``output_shape_dtype`` (float64, float32): y has x's shape, dtype, device; finite.
    * ``value_independent_of_adjoint``: y bitwise equal (``torch.equal``) under OneStep,
      Unroll, Truncated(2), Phantom(2, 0.5), Neumann(3, 0.5) and Implicit.
    * ``gradient_under_default_mode`` / ``gradient_under_unroll``: x's gradient finite and
      non-zero (the default mode is the layer's own ``adjoint``, OneStep unless set); under
      Unroll every parameter's gradient too (no dead parameters).
    * ``unroll_matches_finite_differences`` (float64): the Unroll x-gradient against central
      differences (eps 1e-6, 3 random directions) of the layer's own output; rel. error
      <= 1e-5. Skipped when ``exact_unroll`` is False (default: the class attribute
      ``exact_unroll``; VQ sets it False: its readout holds ||X|| constant by design).
    * ``empty_batch``: x (0, C, H, W) gives y (0, C, H, W) and a backward pass.
    * ``non_contiguous_input``: a transposed x gives the same output as its contiguous copy.
    * ``clear_errors``: NaN in x -> ``ih.NonFiniteError``, a 2-D x -> ValueError, a negative x
      for a ``nonnegative`` layer -> ValueError, each with a message.
    * ``unknown_option_refused``: ``cls(rank=2, no_such_option=1)`` raises TypeError listing
      the valid options.

    Args:
        target: the Decomposition subclass or a built layer.
        exact_unroll: whether the Unroll gradient is the exact derivative of the output.
        fail_fast: raise ``ConformanceError`` at the first failure; else collect all.
    """
    cls = target if isinstance(target, type) else type(target)
    if not issubclass(cls, Decomposition):
        raise TypeError(f"check_decomposition expects a Decomposition, got {cls.__name__}")
    exact = getattr(cls, "exact_unroll", True) if exact_unroll is None else exact_unroll
    with torch.random.fork_rng(devices=[]):  # the caller's random state stays untouched
        layer = build(target)
        checker = Checker(repr(layer), fail_fast)
        for check, problem, body in _plan(layer, cls, exact):
            checker.run(check, problem, body)
    return checker.finish()


def _plan(
    layer: Decomposition, cls: type[Decomposition], exact: bool
) -> list[tuple[str, str, Callable[[], dict[str, float] | None]]]:
    """The (check, problem, body) triples ``check_decomposition`` runs, in order."""
    name = "feature_map"
    plan: list[tuple[str, str, Callable[[], dict[str, float] | None]]] = [
        (
            "output_shape_dtype",
            f"{name}_{_short(dtype)}",
            partial(_output_shape_dtype, layer, dtype),
        )
        for dtype in (torch.float64, torch.float32)
    ]
    plan += [
        ("value_independent_of_adjoint", name, partial(_values, layer)),
        ("gradient_under_default_mode", name, partial(_live_gradient, layer, None)),
        ("gradient_under_unroll", name, partial(_live_gradient, layer, Unroll())),
    ]
    if exact:
        plan.append(("unroll_matches_finite_differences", name, partial(_unroll_fd, layer)))
    plan += [
        ("empty_batch", name, partial(_empty_batch, layer)),
        ("non_contiguous_input", name, partial(_non_contiguous, layer)),
        ("clear_errors", name, partial(_clear_errors, layer)),
        ("unknown_option_refused", name, partial(_unknown_option, cls)),
    ]
    return plan


def _short(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.float", "f")


def _output_shape_dtype(layer: Decomposition, dtype: torch.dtype) -> dict[str, float]:
    layer = copy.deepcopy(layer).to(dtype)
    x = feature_map(layer, dtype)
    y = run_layer(layer, x, None, initial_bases(layer, x))
    require(
        y.shape == x.shape and y.dtype == x.dtype and y.device == x.device,
        f"output {y.dtype} {tuple(y.shape)} on {y.device} for input {x.dtype} "
        f"{tuple(x.shape)} on {x.device}",
    )
    require(bool(torch.isfinite(y).all()), "the output is not finite")
    return {}


def _values(layer: Decomposition) -> dict[str, float]:
    x = feature_map(layer, torch.float64)
    bases = initial_bases(layer, x)
    modes = [
        Unroll(),
        Truncated(2),
        Phantom(2, 0.5),
        Neumann(3, 0.5),
        Implicit(linear_solver="dense"),
    ]
    reference = run_layer(layer, x, OneStep(), bases)
    worst = 0.0
    for mode in modes:
        try:
            y = run_layer(layer, x, mode, bases)
        except NotApplicableError:
            continue
        diff = float((y - reference).detach().abs().max())
        worst = max(worst, diff)
        require(
            torch.equal(y, reference),
            f"the output under {mode!r} differs from the one under "
            "OneStep() (the backward mode must never change the value)",
            max_abs_diff=diff,
        )
    return {"max_abs_diff": worst}


def _live_gradient(layer: Decomposition, adjoint: Adjoint | None) -> dict[str, float]:
    """x's gradient finite and non-zero; under Unroll also every parameter's (a parameter
    that shapes the output must be reached by the exact gradient)."""
    x = feature_map(layer, torch.float64)
    weights = torch.randn(x.shape, generator=torch.Generator().manual_seed(2), dtype=x.dtype)
    y = run_layer(layer, x, adjoint, initial_bases(layer, x))
    named = [("x", x)]
    if isinstance(adjoint, Unroll):
        named += [(n, p) for n, p in layer.named_parameters() if p.requires_grad]
    loss = (weights * y).sum()
    grads = (
        torch.autograd.grad(loss, [t for _, t in named], allow_unused=True)
        if loss.requires_grad
        else [None] * len(named)
    )
    mode = repr(adjoint or layer.adjoint)
    norms = {}
    for (name, _), g in zip(named, grads, strict=True):
        norm = 0.0 if g is None else float(g.norm())
        require(
            math.isfinite(norm),
            f"the gradient of {name} under {mode} is not finite",
            grad_norm=norm,
        )
        require(
            norm > 0, f"the gradient of {name} under {mode} is zero: a dead input", grad_norm=norm
        )
        norms[name] = norm
    return {"grad_norm": norms["x"], "min_grad_norm": min(norms.values())}


def _unroll_fd(layer: Decomposition) -> dict[str, float]:
    x = feature_map(layer, torch.float64)
    bases = initial_bases(layer, x)
    weights = torch.randn(x.shape, generator=torch.Generator().manual_seed(2), dtype=x.dtype)
    y = run_layer(layer, x, Unroll(), bases)
    gradient = (x_gradient((weights * y).sum(), x),)
    return matches_fd(
        (x,),
        gradient,
        lambda: (weights * run_layer(layer, x, Unroll(), bases)).sum(),
        UNROLL_FD_RTOL,
        "the Unroll gradient disagrees with finite differences of the layer's output",
    )


def _empty_batch(layer: Decomposition) -> dict[str, float]:
    x = feature_map(layer, torch.float64, batch=0)
    for mode in (None, Unroll()):
        y = run_layer(layer, x, mode, None)
        require(y.shape == x.shape, f"empty batch: output {tuple(y.shape)} for {tuple(x.shape)}")
        grad = x_gradient(y.sum(), x)
        require(grad.shape == x.shape, "empty batch: wrong gradient shape")
    return {}


def _non_contiguous(layer: Decomposition) -> dict[str, float]:
    x = feature_map(layer, torch.float64).detach().transpose(2, 3).requires_grad_()
    bases = initial_bases(layer, x)
    y = run_layer(layer, x, None, bases)
    y_ref = run_layer(layer, x.detach().contiguous(), None, bases)
    diff = float((y - y_ref).detach().abs().max())
    require(y.shape == x.shape, f"output {tuple(y.shape)} for a non-contiguous {tuple(x.shape)}")
    require(
        diff <= 1e-12 * max(1.0, float(y_ref.abs().max())),
        "a non-contiguous input gives another output than its contiguous copy",
        max_abs_diff=diff,
    )
    grad = x_gradient(y.sum(), x)
    require(bool(torch.isfinite(grad).all()), "non-finite gradient for a non-contiguous input")
    return {"max_abs_diff": diff}


def _clear_errors(layer: Decomposition) -> dict[str, float]:
    """NaN in x -> NonFiniteError; a 2-D x (neither a map (B, C, H, W) nor a sequence
    (B, C, N)) -> ValueError; a negative x for a non-negative layer -> ValueError; each with a
    message."""
    x = feature_map(layer, torch.float64).detach()
    nan = x.clone()
    nan[0, 0, 0, 0] = math.nan
    cases = [("x holds NaN", nan, NonFiniteError), ("x is 2-D", x[0, 0], ValueError)]
    if layer.nonnegative:
        cases.append(("x is negative", -x, ValueError))
    for what, bad, expected in cases:
        expect_error(what, partial(layer, bad), expected)
    return {}


def _unknown_option(cls: type[Decomposition]) -> dict[str, float]:
    try:
        options: dict[str, Any] = {"rank": 2, "no_such_option": 1}
        cls(**options)
    except TypeError as err:
        require("rank" in str(err), f"the TypeError does not list the valid options: {err}")
        return {}
    require(False, "an unknown constructor option was accepted silently")
    return {}
