"""Diagnostics for choosing a backward mode: gradient norms, gradient fidelity across backward
modes, conditioning at the fixed point, convergence traces, plots, and a training callback.

Entry points:

* ``compare_adjoints(layer_or_fn, inputs, loss_fn, adjoints=[...])``: cosine / relative error /
  norm ratio / time / saved bytes of each backward mode's gradient against a reference;
* ``estimate_conditioning(f, z_star, *args)`` and ``check_conditioning(problem, threshold)``:
  spectral radius of J, σ_max, σ_min and κ of I - J (warns ``ConditioningWarning``);
* ``contraction_factors(residuals)``, ``convergence_trace`` / ``convergence_rows``,
  ``steps_to_tolerance``, ``grad_vs_k`` / ``bptt_grad_norms``;
* ``grad_norms(model)``, ``LayerGradientHooks``; ``DiagnosticsCallback`` for training loops;
* ``plot_residuals``, ``plot_grad_vs_k``, ``plot_conditioning_history`` (PNG, Agg).
"""

from ..layers import find_implicit_layers
from .callback import DiagnosticsCallback
from .conditioning import (
    ConditioningReport,
    check_conditioning,
    conditioning_of,
    contraction_factors,
    contraction_rate,
    estimate_conditioning,
    warn_if_ill_conditioned,
)
from .convergence import (
    ConvergenceTrace,
    bptt_grad_norms,
    convergence_rows,
    convergence_trace,
    grad_vs_k,
    steps_to_tolerance,
)
from .fidelity import compare_adjoints, describe_adjoint
from .gradient_norms import LayerGradientHooks, grad_norms
from .jacobian import FixedPointJacobian
from .krylov import arnoldi_dominant, lanczos_extremes
from .plots import plot_conditioning_history, plot_grad_vs_k, plot_residuals
from .table import Rows, format_table

__all__ = [
    "ConditioningReport",
    "ConvergenceTrace",
    "DiagnosticsCallback",
    "FixedPointJacobian",
    "LayerGradientHooks",
    "Rows",
    "arnoldi_dominant",
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
    "find_implicit_layers",
    "format_table",
    "grad_norms",
    "grad_vs_k",
    "lanczos_extremes",
    "plot_conditioning_history",
    "plot_grad_vs_k",
    "plot_residuals",
    "steps_to_tolerance",
    "warn_if_ill_conditioned",
]
