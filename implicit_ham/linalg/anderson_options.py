"""The options every Anderson solver of the library has, declared and checked once.

``AndersonOptions`` is inherited by the backward linear solver ``AndersonSolve`` (here, in
``linalg``) and, with a budget, a damping and a stopping metric, by the forward solvers
``Anderson`` and ``TorchDEQAnderson`` (``solvers.options.AndersonSolverOptions``): the same
history size, regularisation and retry, with the same defaults and the same errors.
"""

from __future__ import annotations

from dataclasses import dataclass

from implicit_ham._core.validation import check_nonnegative, check_positive_int


@dataclass(frozen=True)
class AndersonOptions:
    """Anderson mixing's options.

    Attributes:
        m: history size (>= 2): how many past residuals the mixing system combines.
        lam: Tikhonov regularisation of the mixing system (>= 0).
        retry_lam: the regularisation of the one retry after a singular mixing system or a
            non-finite iterate (>= 0; the retry uses ``max(lam, retry_lam)``).
    """

    m: int = 5
    lam: float = 1e-4
    retry_lam: float = 1e-2

    def __post_init__(self) -> None:
        self.check_mixing()

    def check_mixing(self) -> None:
        """ValueError naming the class and the field when an option is out of range."""
        owner = type(self).__name__
        check_positive_int(owner, "m", self.m, minimum=2)
        check_nonnegative(owner, "lam", self.lam, "no regularisation")
        check_nonnegative(owner, "retry_lam", self.retry_lam, "retry without regularisation")

    @property
    def attempts(self) -> tuple[float, float]:
        """The regularisation of the first solve and of its retry: ``(lam, max(lam,
        retry_lam))``."""
        return self.lam, max(self.retry_lam, self.lam)
