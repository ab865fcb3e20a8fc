"""One builder for an artefact several jobs share (e.g. the generation metrics' classifier).

The jobs of a sweep running side by side would all find the shared file missing and all build
it. ``artefact_lock(path)`` holds an exclusive ``fcntl.flock`` on ``<path>.lock`` around the
"load it, else build and write it" step: the first job builds the artefact while the others
wait (logging who holds the lock), then load what it wrote. The kernel drops the lock when its
holder dies, so a crashed builder never blocks the others.
"""

from __future__ import annotations

import fcntl
import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

logger = logging.getLogger(__name__)


@contextmanager
def artefact_lock(path: str | Path, timeout_s: float = 3600.0) -> Iterator[None]:
    """Hold the build lock of the artefact ``path`` (waiting up to ``timeout_s`` seconds for
    another process building it; TimeoutError naming the lock file after that)."""
    lock = Path(path).with_name(Path(path).name + ".lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace") or "another process"
            logger.info("%s is being built by %s; waiting for it", path, holder)
            deadline = time.monotonic() + timeout_s
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise TimeoutError(
                            f"{lock} was held for more than {timeout_s:g} s by {holder}; if that "
                            "process is gone from its host, delete the lock file"
                        ) from None
                    time.sleep(0.2)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock
