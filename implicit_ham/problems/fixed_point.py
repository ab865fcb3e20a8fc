"""``fixed_point``: the entry point that turns an iteration ``z <- f(z, *args)`` into a layer."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from torch import Tensor, nn
from torch.nn.utils import parametrize

from implicit_ham._core.errors import name_the_call
from implicit_ham._core.grad_guard import guard_gradient
from implicit_ham._core.solve_scope import solve_scope
from implicit_ham._core.state import BoundStep, State, StateSpec
from implicit_ham._core.stats import BackwardStats, SolverStats
from implicit_ham._core.transforms import host_checks
from implicit_ham.adjoints.modes import ADJOINTS, Adjoint, OneStep
from implicit_ham.problems.input_checks import check_state_against_parameters
from implicit_ham.problems.states import StateRecorder, attach_states, state_indices
from implicit_ham.solvers.base import SOLVERS, FixedPointSolver
from implicit_ham.solvers.iteration import DEFAULT_TOL_STEPS, FixedPointIteration

# the defaults, built once (both are frozen dataclasses: sharing them shares no state); the
# solver runs to a tolerance, within FixedPointIteration's budget for one (100 steps); where no
# tolerance can be checked (torch.func.vmap, torch.compile) it runs that whole budget
DEFAULT_TOL = 1e-5
_DEFAULT_SOLVER = FixedPointIteration(tol=DEFAULT_TOL)
_DEFAULT_TRACED_SOLVER = FixedPointIteration(max_steps=DEFAULT_TOL_STEPS)
_DEFAULT_ADJOINT = OneStep()


@dataclass
class Solution:
    """The result of ``fixed_point``.

    Attributes:
        value: the solution, same structure as ``z0``, carrying the backward mode's gradient.
        stats: forward statistics (steps, residual trace, final residuals, converged flag).
        backward_log: statistics of every backward pass through ``value`` (implicit-type modes
            append one entry per backward; the other modes leave it empty).
        states: the intermediate states asked for with ``fixed_point(..., states=)`` (each with
            its own gradient, see ``implicit_ham.problems.states``); empty otherwise.
    """

    value: Tensor | tuple[Tensor, ...]
    stats: SolverStats
    backward_log: list[BackwardStats] = field(default_factory=list)
    states: list[Tensor | tuple[Tensor, ...]] = field(default_factory=list)

    @property
    def backward_stats(self) -> BackwardStats | None:
        """The latest backward statistics, or None before any backward pass."""
        return self.backward_log[-1] if self.backward_log else None


@dataclass(frozen=True)
class FixedPointProblem:
    """A fixed-point problem ``z = f(z, *args)`` with its initial state, as data.

    Layers expose the problem they solve (e.g. a decomposition's ``implicit_problem(x)``) so
    that diagnostics can re-solve it under other solvers / backward modes and probe ``f``.

    Attributes:
        f: ``f(z, *args) -> z'``. z0: initial state (Tensor or tuple, batch first). args: inputs.
    """

    f: Callable[..., Tensor | Sequence[Tensor]]
    z0: Tensor | tuple[Tensor, ...]
    args: tuple[Any, ...] = ()

    def solve(
        self, solver: FixedPointSolver | str | None = None, adjoint: Adjoint | str | None = None
    ) -> Solution:
        """``fixed_point(self.f, self.z0, *self.args, solver=solver, adjoint=adjoint)``."""
        return fixed_point(self.f, self.z0, *self.args, solver=solver, adjoint=adjoint)


def fixed_point(
    f: Callable[..., Tensor | Sequence[Tensor]],
    z0: Tensor | Sequence[Tensor],
    *args: Any,
    solver: FixedPointSolver | str | None = None,
    adjoint: Adjoint | str | None = None,
    states: int | Sequence[int] | None = None,
) -> Solution:
    """Solve ``z = f(z, *args)`` from ``z0``; differentiate it with the chosen backward mode.

    Args:
        f: ``f(z, *args) -> z'`` with ``z'`` shaped like ``z`` (a Tensor or tuple of Tensors,
            batch first). Tensors the gradient must reach go in ``args`` or are parameters
            ``f`` closes over.
        z0: initial state, (B, ...) or a tuple of (B, ...) tensors sharing B and dtype.
        *args: extra inputs of ``f``.
        solver: forward solver or its registry name; default
            ``FixedPointIteration(tol=1e-5)``: plain iteration until every sample's relative
            residual is at most 1e-5, at most 100 steps (a ``ConvergenceWarning`` past them).
            Where no tolerance can be checked on the host (inside ``torch.func.vmap`` or
            ``torch.compile``) the default runs that whole budget, 100 steps, without
            stopping: the same or a more converged value, at a fixed cost. A fixed number of
            steps of your choice (no host synchronisation per step) is
            ``FixedPointIteration(max_steps=K)``.
        adjoint: backward mode or its registry name; default ``OneStep()``.
        states: also return intermediate states in ``Solution.states`` (for
            ``fixed_point_correction``): ``n`` spread over the step budget (TorchDEQ's
            ``n_states``) or a list of evaluation indices in [1, max_steps] (its ``indexing``).
            The value is the same with and without it.

    Returns:
        A ``Solution``. The backward mode changes only the gradient: with the same solver
        settings ``value`` is identical under Unroll, Truncated, OneStep, Phantom(tau=1),
        Implicit and Neumann (exactly so for FixedPointIteration; the torchdeq solvers spend
        the last k of their budget on plain steps under the through-iteration modes).
        A NaN / inf gradient reaching ``args`` or ``z0`` raises ``NonFiniteError``.
        Parametrised weights of f (``ih.nn.apply_norm``) are computed once per solve when f is
        the module itself (or one of its methods).
    """
    if not callable(f):
        raise TypeError(f"f must be callable, got {type(f).__name__}")
    if solver is None:
        solver = _DEFAULT_SOLVER if host_checks() else _DEFAULT_TRACED_SOLVER
    solver = SOLVERS.resolve(solver, FixedPointSolver)
    adjoint = ADJOINTS.resolve(_DEFAULT_ADJOINT if adjoint is None else adjoint, Adjoint)
    spec = StateSpec.of(z0)
    check_state_against_parameters(f, spec.as_tuple(z0), "fixed_point")
    if torch.is_grad_enabled():  # without grad mode no gradient can reach a guard
        where = f"fixed_point (adjoint={adjoint.name})"
        args = tuple(guard_gradient(a, f"{where}, args[{i}]") for i, a in enumerate(args))
        z0 = spec.restore(
            tuple(guard_gradient(t, f"{where}, z0[{i}]") for i, t in enumerate(spec.as_tuple(z0)))
        )

    wanted = None if states is None else state_indices(states, solver.max_steps)
    recorder = StateRecorder(wanted) if wanted else None
    step = BoundStep(_checked_map(f, spec, recorder), args)

    if spec.batch == 0:
        return _empty_batch(step, spec.as_tuple(z0), spec, solver)
    if torch.compiler.is_compiling():  # no Python-level solve scope inside a compiled graph
        z, stats, log = adjoint.run(step, spec.as_tuple(z0), spec, solver)
    else:
        with _one_solve(f):
            z, stats, log = adjoint.run(step, spec.as_tuple(z0), spec, solver)
    if recorder is None:
        return Solution(spec.restore(z), stats, log)
    kept = attach_states(recorder, stats.steps, z, BoundStep(_plain(spec, f), args), adjoint)
    return Solution(spec.restore(z), stats, log, [spec.restore(s) for s in kept])


def _checked_map(
    f: Callable[..., Any], spec: StateSpec, recorder: StateRecorder | None
) -> Callable[[State, tuple[Any, ...]], State]:
    """The map on tuple states, checking that ``f`` keeps the state's structure, shapes and
    dtype (``spec.check``), and showing each new state to ``recorder`` when there is one. A
    one-tensor state without a recorder gets a lean version (the map runs once per iteration:
    the general walk of ``spec.check`` only where the quick test fails, to name the problem)."""
    if recorder is None and not spec.is_tuple and len(spec.shapes) == 1:
        shape, dtype = spec.shapes[0], spec.dtype

        def lean(z: State, inputs: tuple[Any, ...]) -> State:
            try:
                value = f(z[0], *inputs)
            except Exception as error:
                name_the_call(error, "fixed_point", "f", z, inputs)
                raise
            if type(value) is Tensor and value.shape == shape and value.dtype == dtype:
                return (value,)
            return spec.check(value, where="fixed_point")

        return lean

    def call(z: State, inputs: tuple[Any, ...]) -> State:
        try:
            value = f(spec.restore(z), *inputs)
        except Exception as error:
            name_the_call(error, "fixed_point", "f", z, inputs)
            raise
        out = spec.check(value, where="fixed_point")
        if recorder is not None:
            recorder.see(out)
        return out

    return call


def _plain(spec: StateSpec, f: Callable[..., Any]) -> Callable[[State, tuple[Any, ...]], State]:
    """The map on tuple states, without the recorder (the states' gradient steps)."""

    def call(z: State, inputs: tuple[Any, ...]) -> State:
        return spec.check(f(spec.restore(z), *inputs), where="fixed_point")

    return call


def _one_solve(f: Callable[..., Any]) -> AbstractContextManager[Any]:
    """The scope of one solve: a fresh solve token (``VariationalDropout`` keeps one mask per
    token) and, when ``f`` is an ``nn.Module`` (or its bound method) with parametrised weights
    (``ih.nn.apply_norm``), those weights computed once per solve instead of once per
    iteration: under ``parametrize.cached()``, primed in the caller's gradient mode before the
    solve so that the steps without gradient and the steps with gradient share one weight that
    carries its graph (a cache filled inside a no-grad step would cut the gradient). Not
    entered while ``torch.compile`` traces (Python-level state the compiled graph cannot hold;
    ``VariationalDropout`` refuses to train there)."""
    owner = f if isinstance(f, nn.Module) else getattr(f, "__self__", None)
    layers = (
        [m for m in owner.modules() if parametrize.is_parametrized(m)]
        if isinstance(owner, nn.Module)
        else []
    )
    if not layers:
        return solve_scope()
    stack = ExitStack()
    stack.enter_context(solve_scope())
    stack.enter_context(parametrize.cached())
    for layer in layers:
        for name in cast(nn.ModuleDict, layer.parametrizations):
            getattr(layer, name)  # fills the cache
    return stack


def _empty_batch(
    step: Callable[[State], State], z0: State, spec: StateSpec, solver: FixedPointSolver
) -> Solution:
    """An empty batch (B = 0): ``f(z0)`` (empty, but connected to ``f``'s parameters, whose
    gradient is then zero) and the statistics of a solve that took no step."""
    value = step(z0)
    trace, last = value[0].detach().new_zeros(0, 0), value[0].detach().new_zeros(0)
    converged = None if solver.tol is None else last.bool()
    stats = SolverStats(solver.name, 0, trace, last, last, converged)
    return Solution(spec.restore(value), stats)
