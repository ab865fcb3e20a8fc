"""The options of the accelerated forward solvers, declared and checked once.

The native solvers (``Anderson``, ``Broyden``, ``solvers.accelerated``) and torchdeq's
(``TorchDEQAnderson``, ``TorchDEQBroyden``, ``solvers.torchdeq``) inherit the same options
dataclass, so a native solver and its torchdeq reference take the same arguments with the same
defaults and the same errors. The mixing options of Anderson (``m``, ``lam``, ``retry_lam``) are
``linalg.AndersonOptions``, shared with the backward ``AndersonSolve``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from implicit_ham._core.validation import check_budget, check_choice, check_unit_interval
from implicit_ham.linalg.anderson_options import AndersonOptions
from implicit_ham.solvers.base import STOP_MODES


@dataclass(frozen=True)
class AcceleratedBudget:
    """The budget and tolerance of an accelerated solver.

    Attributes:
        max_steps: budget of ``f`` evaluations (at least ``min_steps``).
        tol: stopping tolerance; None uses the whole budget.
    """

    max_steps: int = 50
    tol: float | None = 1e-5
    min_steps: ClassVar[int] = 3

    def check_budget(self) -> None:
        """ValueError naming the class and the field when an option is out of range."""
        check_budget(type(self).__name__, self.max_steps, self.tol, self.min_steps)


@dataclass(frozen=True)
class AndersonSolverOptions(AndersonOptions, AcceleratedBudget):
    """Options of a forward Anderson solver: the budget, the mixing options
    (``AndersonOptions``), and

    Attributes:
        damping: mixing step size in (0, 1].
        stop_mode: "rel" or "abs" (the stopping metric of ``tol``).
    """

    damping: float = 1.0
    stop_mode: str = "rel"
    min_steps: ClassVar[int] = 4

    def __post_init__(self) -> None:
        owner = type(self).__name__
        self.check_budget()
        self.check_mixing()
        check_unit_interval(owner, "damping", self.damping)
        check_choice(owner, "stop_mode", self.stop_mode, STOP_MODES)


@dataclass(frozen=True)
class BroydenSolverOptions(AcceleratedBudget):
    """Options of a forward Broyden solver: the budget, and

    Attributes:
        stop_mode: "rel" or "abs" (the stopping metric of ``tol``).
    """

    stop_mode: str = "rel"

    def __post_init__(self) -> None:
        self.check_budget()
        check_choice(type(self).__name__, "stop_mode", self.stop_mode, STOP_MODES)
