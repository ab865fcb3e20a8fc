"""Diagnostics for choosing a backward mode: gradient norms, gradient fidelity across backward
modes, conditioning at the fixed point, convergence traces, plots, and a training callback.

Entry points:

* ``compare_adjoints(layer_or_fn, inputs, loss_fn, adjoints=[...])``: cosine / relative error /
  norm ratio / time / saved bytes of each backward mode's gradient against a reference;
* ``estimate_conditioning(f, z_star, *args)`` and ``check_conditioning(problem, threshold)``:
  spectral radius of J, σ_max, σ_min and κ of I - J (warns ``ConditioningWarning``);
* ``contraction_factors(residuals)``, ``convergence_trace`` / ``convergence_rows``,
  ``steps_to_tolerance``, ``grad_vs_k`` / ``bptt_grad_norms``;
* ``grad_norms(model)``, ``LayerGradientHooks``; ``DiagnosticsCallback`` for training loops,
  logging to any ``Sink`` (``log(metrics, step)``, ``log_table``, ``close``; ``MultiSink`` fans
  out);
* ``plot_residuals``, ``plot_grad_vs_k``, ``plot_conditioning_history`` (PNG, Agg);
* ``events()`` (the event ledger), ``event_source``, ``label_events`` / ``attribute_events``
  (events counted per layer in plain PyTorch).
"""

from implicit_ham._core.events import (
    EventLabels,
    EventLedger,
    event_source,
    events,
    label_events,
    label_layers,
)
from implicit_ham._core.sinks import MultiSink, Scalar, Sink, plain_metrics
from implicit_ham.adjoints.layers import ImplicitLayer, find_implicit_layers
from implicit_ham.diagnostics.attribution import attribute_events
from implicit_ham.diagnostics.callback import DiagnosticsCallback
from implicit_ham.diagnostics.conditioning import (
    ConditioningReport,
    check_conditioning,
    conditioning_of,
    contraction_factors,
    contraction_rate,
    estimate_conditioning,
    warn_if_ill_conditioned,
)
from implicit_ham.diagnostics.convergence import (
    ConvergenceTrace,
    bptt_grad_norms,
    convergence_rows,
    convergence_trace,
    grad_vs_k,
    steps_to_tolerance,
)
from implicit_ham.diagnostics.fidelity import compare_adjoints, describe_adjoint
from implicit_ham.diagnostics.gradient_norms import LayerGradientHooks, grad_norms
from implicit_ham.diagnostics.jacobian import FixedPointJacobian
from implicit_ham.diagnostics.plots import plot_conditioning_history, plot_grad_vs_k, plot_residuals
from implicit_ham.diagnostics.table import Rows, format_table
from implicit_ham.linalg.krylov import arnoldi_dominant, lanczos_extremes

__all__ = [
    "ConditioningReport",
    "ConvergenceTrace",
    "DiagnosticsCallback",
    "EventLabels",
    "EventLedger",
    "FixedPointJacobian",
    "ImplicitLayer",
    "LayerGradientHooks",
    "MultiSink",
    "Rows",
    "Scalar",
    "Sink",
    "arnoldi_dominant",
    "attribute_events",
    "bptt_grad_norms",
    "check_conditioning",
    "compare_adjoints",
    "conditioning_of",
    "contraction_factors",
    "contraction_rate",
    "convergence_rows",
    "convergence_trace",
    "describe_adjoint",
    "estimate_conditioning",
    "event_source",
    "events",
    "find_implicit_layers",
    "format_table",
    "grad_norms",
    "grad_vs_k",
    "label_events",
    "label_layers",
    "lanczos_extremes",
    "plain_metrics",
    "plot_conditioning_history",
    "plot_grad_vs_k",
    "plot_residuals",
    "steps_to_tolerance",
    "warn_if_ill_conditioned",
]
