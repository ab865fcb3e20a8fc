"""Which solve is running: a token that ``fixed_point`` sets for the duration of one solve.

Modules evaluated inside the map ``f`` read it to keep something fixed across the iterations of
one solve and fresh between solves (``VariationalDropout`` draws one mask per solve). The token
lives in a ``contextvars.ContextVar``, so concurrent solves in other threads or tasks do not see
each other's token; outside any solve it is None.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from contextvars import ContextVar

_CURRENT: ContextVar[object | None] = ContextVar("implicit_ham_solve", default=None)


def current_solve() -> object | None:
    """The token of the innermost running solve (compared by identity), or None."""
    return _CURRENT.get()


class _Scope:
    """The context manager of one solve (a class: entered once per solve, on the hot path)."""

    __slots__ = ("_reset",)

    def __enter__(self) -> object:
        token = object()
        self._reset = _CURRENT.set(token)
        return token

    def __exit__(self, *exc: object) -> None:
        _CURRENT.reset(self._reset)


def solve_scope() -> AbstractContextManager[object]:
    """Mark the body of a ``with`` as one solve; it yields the solve's token. Nested solves get
    their own token and the outer one is restored on exit."""
    return _Scope()
