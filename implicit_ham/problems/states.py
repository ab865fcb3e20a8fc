"""Intermediate states of a fixed-point solve, each with a gradient of its own (TorchDEQ's
``n_states`` / ``indexing``): what the fixed-point correction loss is computed on.

State i is the output of the i-th evaluation of ``f`` in the solve (1 <= i <= max_steps): the
iterate z_i for ``FixedPointIteration``, the image ``f(x_{i-1})`` of the i-th iterate for
Anderson / Broyden. An index beyond the evaluations the solver spent (it stopped at its
tolerance) gives the solution. Each state keeps its value exactly and carries the gradient of
the backward mode's steps taken from it: ``Phantom(k, tau)``'s k damped steps, ``Truncated(k)``'s
k plain steps, one plain step (the one-step gradient at that state) for every other mode.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from implicit_ham._core.state import State, StepFn, detached, with_gradient_of
from implicit_ham.adjoints.modes import Adjoint, Phantom, Truncated
from implicit_ham.solvers.base import damped


def state_indices(states: int | Sequence[int] | None, max_steps: int) -> list[int]:
    """The evaluation indices to keep: ``n`` states spread over the budget as TorchDEQ does
    (the last at ``max_steps``), or the given indices, sorted; [] for None.

    Raises:
        ValueError: n < 1, or an index outside [1, max_steps] (the step budget).
    """
    if states is None:
        return []
    if isinstance(states, bool):
        raise TypeError("states must be an int or a sequence of step indices, got a bool")
    if isinstance(states, int):
        if not 1 <= states <= max_steps:
            raise ValueError(
                f"fixed_point: states={states} must be in [1, max_steps={max_steps}] (the "
                "solver's step budget)"
            )
        delta = max_steps // states
        return [max_steps - (states - k - 1) * delta for k in range(states)]
    indices = sorted({int(i) for i in states})
    bad = [i for i in indices if not 1 <= i <= max_steps]
    if not indices or bad:
        raise ValueError(
            f"fixed_point: state indices {bad or list(states)} must be non-empty and in "
            f"[1, max_steps={max_steps}] (the solver's step budget)"
        )
    return indices


class StateRecorder:
    """Wraps the map: keeps (detached) the outputs of the evaluations whose 1-based index is
    wanted, counting every evaluation."""

    def __init__(self, wanted: list[int]) -> None:
        self.wanted, self.calls = set(wanted), 0
        self.kept: dict[int, State] = {}

    def see(self, out: State) -> None:
        """Record one evaluation's output."""
        self.calls += 1
        if self.calls in self.wanted:
            self.kept[self.calls] = detached(out)


def attach_states(
    recorder: StateRecorder, spent: int, solution: State, step: StepFn, adjoint: Adjoint
) -> list[State]:
    """The kept states (indices beyond ``spent`` evaluations: the solution), each carrying the
    gradient of ``adjoint``'s steps from it (see the module docstring)."""
    if isinstance(adjoint, Phantom):
        steps, move = adjoint.k, damped(step, adjoint.tau)
    elif isinstance(adjoint, Truncated):
        steps, move = adjoint.k, step
    else:
        steps, move = 1, step
    out = []
    for index in sorted(recorder.wanted):
        base = recorder.kept.get(index) if index <= spent else None
        base = detached(solution) if base is None else base
        if not torch.is_grad_enabled():
            out.append(base)
            continue
        p = base
        for _ in range(steps):
            p = move(p)
        out.append(with_gradient_of(base, p))
    return out
