"""A worker function for pool tests: returns its item squared, or dies (``os._exit``, as a
killed process would) when the item is negative."""

from __future__ import annotations

import os


def square_or_die(item: int) -> int:
    if item < 0:
        os._exit(9)
    return item * item


def own_pid(item: int) -> int:
    """The process id of the worker that ran ``item``."""
    return os.getpid()
