"""``writing(path)``: an ``OSError`` raised while writing a job's file names that file.

A write or flush that fails on a full disk raises ``OSError(ENOSPC, "No space left on
device")`` with no file name (the file was opened earlier), so the error a failed job records
in ``results.json`` would not say which file; inside ``writing(path)`` such an error is raised
again as the same ``OSError`` subclass and errno with ``path`` as its file name.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def writing(path: str | Path) -> Iterator[None]:
    """Name ``path`` in an ``OSError`` without a file name raised in the block."""
    try:
        yield
    except OSError as err:
        if err.filename is not None or err.errno is None:
            raise
        raise type(err)(err.errno, err.strerror, str(path)) from err
