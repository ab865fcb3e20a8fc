"""Which solve is running: a token that ``fixed_point`` sets for the duration of one solve.

Modules evaluated inside the map ``f`` read it to keep something fixed across the iterations of
one solve and fresh between solves (``VariationalDropout`` draws one mask per solve). The token
lives in a ``contextvars.ContextVar``, so concurrent solves in other threads or tasks do not see
each other's token; outside any solve it is None.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_CURRENT: ContextVar[object | None] = ContextVar("implicit_ham_solve", default=None)


def current_solve() -> object | None:
    """The token of the innermost running solve (compared by identity), or None."""
    return _CURRENT.get()


@contextmanager
def solve_scope() -> Iterator[object]:
    """Mark the body as one solve; yields its token. Nested solves get their own token and the
    outer one is restored on exit."""
    token = object()
    reset = _CURRENT.set(token)
    try:
        yield token
    finally:
        _CURRENT.reset(reset)
