"""Gradient fidelity: the gradient of one batch under several backward modes, against a reference.

``compare_adjoints`` runs forward and backward once per mode on the same inputs, with the global
RNG forked and re-seeded identically for every mode (so random initial states coincide), checks
that the forward outputs are equal, and reports for each mode the cosine similarity, relative
error and norm ratio of its gradient against the reference gradient, its forward and backward
time and the bytes autograd saved for its backward.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from implicit_ham._core.errors import NonFiniteError
from implicit_ham._core.stats import BackwardStats
from implicit_ham.adjoints.modes import ADJOINTS, Adjoint, Implicit, Unroll
from implicit_ham.diagnostics.measure import SavedTensorBytes, Stopwatch, fork_rng_on
from implicit_ham.diagnostics.reference import (
    REFERENCE_FIXED_POINT_TOL,
    backward_logs,
    distrust_of,
    vouch,
    vouched_reason,
)
from implicit_ham.diagnostics.table import Row, Rows
from implicit_ham.linalg.dense import Dense

logger = logging.getLogger(__name__)

LayerFn = Callable[..., Any]


def describe_adjoint(adjoint: Adjoint | str) -> str:
    """A short label: the registry name and the fields that differ from their defaults, e.g.
    ``truncated(k=3)``, ``phantom(k=5, tau=0.5)``, ``implicit(linear_solver=dense)``."""
    if isinstance(adjoint, str):
        return adjoint
    name = ADJOINTS.name_of(adjoint) or type(adjoint).__name__
    if not dataclasses.is_dataclass(adjoint):
        return name
    changed = []
    for fld in dataclasses.fields(adjoint):
        value = getattr(adjoint, fld.name)
        shown = getattr(value, "name", value)
        default = fld.default
        if fld.name in ("k", "tau") or shown != getattr(default, "name", default):
            changed.append(f"{fld.name}={shown}")
    return f"{name}({', '.join(changed)})" if changed else name


@dataclass
class _Run:
    """One forward + backward under one backward mode."""

    output: list[Tensor]
    grad: Tensor
    forward_s: float
    backward_s: float
    saved_bytes: int
    backward: list[BackwardStats]


def _flat_outputs(out: Any) -> list[Tensor]:
    if isinstance(out, Tensor):
        return [out.detach()]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _flat_outputs(o)]
    value = getattr(out, "value", None)
    if value is not None:
        return _flat_outputs(value)
    raise TypeError(
        f"the layer returned a {type(out).__name__}; compare_adjoints needs a Tensor, a tuple "
        "of Tensors or a Solution"
    )


def _run_mode(
    call: Callable[[Adjoint, Sequence[Any]], Any],
    adjoint: Adjoint,
    inputs: Sequence[Any],
    loss_fn: Callable[[Any], Tensor],
    params: Sequence[Tensor],
    seed: int,
    device: torch.device,
    module: nn.Module | None,
) -> _Run:
    leaves = [
        x.detach().clone().requires_grad_()
        if isinstance(x, Tensor) and x.is_floating_point()
        else x
        for x in inputs
    ]
    wrt = [x for x in leaves if isinstance(x, Tensor) and x.requires_grad] + list(params)
    saved, fwd, bwd = SavedTensorBytes(), Stopwatch(device), Stopwatch(device)
    with fork_rng_on(device):
        torch.manual_seed(seed)
        with fwd.measure(), saved.track():
            out = call(adjoint, leaves)
        loss = loss_fn(out)
        with bwd.measure():
            grads = torch.autograd.grad(loss, wrt, allow_unused=True)
    flat = [
        (torch.zeros_like(w) if g is None else g).reshape(-1)
        for g, w in zip(grads, wrt, strict=True)
    ]
    grad = torch.cat(flat).detach()
    logs = backward_logs(out, module)
    return _Run(_flat_outputs(out), grad, fwd.seconds, bwd.seconds, saved.total, logs)


def _caller(layer_or_fn: nn.Module | LayerFn) -> Callable[[Adjoint, Sequence[Any]], Any]:
    if isinstance(layer_or_fn, nn.Module):
        module = layer_or_fn
        if not hasattr(module, "adjoint"):
            raise TypeError(
                f"{type(module).__name__} has no 'adjoint' attribute, so its backward mode "
                "cannot be switched; pass a function fn(adjoint, *inputs) instead"
            )

        def call_module(adjoint: Adjoint, leaves: Sequence[Any]) -> Any:
            layer: Any = module  # its adjoint is an attribute nn.Module's typing does not know
            original = layer.adjoint
            layer.adjoint = adjoint
            try:
                return layer(*leaves)
            finally:
                layer.adjoint = original

        return call_module
    if callable(layer_or_fn):
        return lambda adjoint, leaves: layer_or_fn(adjoint, *leaves)
    raise TypeError(
        f"layer_or_fn must be an nn.Module with an 'adjoint' attribute or a function "
        f"fn(adjoint, *inputs), got {type(layer_or_fn).__name__}"
    )


def _reference_run(
    run: Callable[[Adjoint], _Run], reference: Adjoint | str
) -> tuple[Adjoint, _Run, str]:
    """The reference mode, its run and why it is the reference. "auto": the dense implicit
    gradient when the library vouches for it (``diagnostics.reference``), else Unroll."""
    if reference != "auto":
        ref = ADJOINTS.resolve(reference, Adjoint)
        chosen = run(ref)
        objections = distrust_of(chosen.backward)
        why = "chosen by the caller"
        if objections:
            why += "; its implicit gradient is not vouched for: " + "; ".join(objections)
            logger.warning("compare_adjoints: the reference %s: %s", describe_adjoint(ref), why)
        return ref, chosen, why
    dense = Implicit(linear_solver=Dense(), tol=1e-8, fixed_point_tol=REFERENCE_FIXED_POINT_TOL)
    try:
        tried, objections = vouch(lambda: run(dense), lambda r: r.backward)
    except (ValueError, NonFiniteError) as err:
        objections = [f"it is unavailable: {err}"]
    else:
        if not objections:
            return dense, tried, "dense implicit gradient: " + vouched_reason(tried.backward)
    why = (
        "unroll: the exact gradient of the forward steps the layer ran; the dense implicit "
        "gradient is not vouched for: " + "; ".join(objections)
    )
    logger.warning("compare_adjoints: reference %s", why)
    return Unroll(), run(Unroll()), why


def _compare(label: str, run: _Run, ref: _Run, why: str | None) -> Row:
    ref_norm = float(torch.linalg.vector_norm(ref.grad))
    norm = float(torch.linalg.vector_norm(run.grad))
    err = float(torch.linalg.vector_norm(run.grad - ref.grad))
    denom = norm * ref_norm
    cosine = float(run.grad @ ref.grad) / denom if denom > 0 else math.nan
    diffs = [
        float((a - b).abs().max()) if a.shape == b.shape and a.numel() else math.inf
        for a, b in zip(run.output, ref.output, strict=True)
    ]
    same = len(run.output) == len(ref.output) and all(
        torch.equal(a, b) for a, b in zip(run.output, ref.output, strict=True)
    )
    row: Row = {
        "adjoint": label,
        "reference": why is not None,
        "cosine": cosine,
        "rel_error": err / ref_norm if ref_norm > 0 else math.nan,
        "norm_ratio": norm / ref_norm if ref_norm > 0 else math.nan,
        "grad_norm": norm,
        "forward_ms": 1e3 * run.forward_s,
        "backward_ms": 1e3 * run.backward_s,
        "saved_bytes": run.saved_bytes,
        "same_forward": same,
        "forward_max_diff": max(diffs, default=0.0),
    }
    if why is not None:
        row["why"] = why
    return row


def compare_adjoints(
    layer_or_fn: nn.Module | LayerFn,
    inputs: Tensor | Sequence[Any],
    loss_fn: Callable[[Any], Tensor],
    adjoints: Sequence[Adjoint | str],
    reference: Adjoint | str = "auto",
    *,
    params: Sequence[Tensor] | None = None,
    seed: int = 0,
    repeats: int = 1,
    warmup: bool = True,
) -> Rows:
    """Gradient of one batch under each backward mode, compared with a reference mode.

    Args:
        layer_or_fn: an ``nn.Module`` with a settable ``adjoint`` attribute (called as
            ``layer(*inputs)``), or a function ``fn(adjoint, *inputs)`` returning the output
            (e.g. ``lambda adj, x: ih.fixed_point(f, z0, x, adjoint=adj).value``).
        inputs: a Tensor or a sequence of positional inputs; floating-point tensors receive a
            gradient (they are cloned; the originals are untouched).
        loss_fn: output -> scalar loss.
        adjoints: the backward modes to compare (instances or registry names).
        reference: the reference mode. "auto": ``Implicit`` with the dense solver when the
            library vouches for it: at a fixed point (relative forward residual <=
            ``REFERENCE_FIXED_POINT_TOL``, 1e-5), its backward solve converged, no
            conditioning warning (``implicit_ham.diagnostics.reference``); otherwise (also
            when the state is too large for it, over 4096 entries, or I - J is singular)
            ``Unroll`` through all forward steps, the exact gradient of the computation the
            layer ran. The warnings of the rejected attempt are not shown: the reference row's
            ``why`` quotes them and a log line repeats it. A mode given here is used as is.
        params: tensors whose gradient is compared too; default: the module's parameters that
            require grad (none for a function).
        seed: seed set (in a forked RNG) before every mode's forward, so random inits coincide.
        repeats: forward + backward runs per mode; times are the minimum over the repeats.
        warmup: run the reference once more before timing anything (first calls pay one-time
            costs: library loading, allocator growth).

    Returns:
        ``Rows`` (a list of dicts; prints as a table), the reference first, one row per mode:
        adjoint, reference, cosine, rel_error (``||g - g_ref|| / ||g_ref||``), norm_ratio,
        grad_norm, forward_ms, backward_ms, saved_bytes, same_forward (outputs bitwise equal
        to the reference's), forward_max_diff; the reference row also ``why``: why that mode
        is the reference, with the numbers. A forward mismatch is also logged as a warning.
    """
    call = _caller(layer_or_fn)
    args = [inputs] if isinstance(inputs, Tensor) else list(inputs)
    if params is None:
        params = (
            [p for p in layer_or_fn.parameters() if p.requires_grad]
            if isinstance(layer_or_fn, nn.Module)
            else []
        )
    tensors = [x for x in args if isinstance(x, Tensor) and x.is_floating_point()]
    if not tensors and not params:
        raise ValueError(
            "compare_adjoints: nothing to differentiate; pass floating-point tensor inputs, "
            "a module with trainable parameters, or params=[...]"
        )
    device = (tensors or list(params))[0].device
    module = layer_or_fn if isinstance(layer_or_fn, nn.Module) else None

    def run(adjoint: Adjoint) -> _Run:
        runs = [
            _run_mode(call, adjoint, args, loss_fn, params, seed, device, module)
            for _ in range(max(repeats, 1))
        ]
        best = min(runs, key=lambda r: r.forward_s + r.backward_s)
        return dataclasses.replace(
            runs[0],
            forward_s=min(r.forward_s for r in runs),
            backward_s=min(r.backward_s for r in runs),
            saved_bytes=best.saved_bytes,
        )

    ref_adjoint, ref, why = _reference_run(run, reference)
    if warmup:
        ref = run(ref_adjoint)
    ref_label = describe_adjoint(ref_adjoint)
    rows = Rows([_compare(ref_label, ref, ref, why)])
    for adjoint in adjoints:
        resolved = ADJOINTS.resolve(adjoint, Adjoint)
        row = _compare(describe_adjoint(resolved), run(resolved), ref, None)
        if not row["same_forward"]:
            logger.warning(
                "compare_adjoints: %s changed the forward value (max abs diff %.3e vs %s); "
                "its gradient is compared at a different point",
                row["adjoint"],
                row["forward_max_diff"],
                ref_label,
            )
        rows.append(row)
    return rows
