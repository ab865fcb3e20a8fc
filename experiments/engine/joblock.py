"""One writer per job directory: an advisory lock on ``<job dir>/.lock``.

Two processes writing one job directory interleave their metric rows and overwrite each other's
checkpoints. ``JobLock`` takes an exclusive ``fcntl.flock`` on ``<job dir>/.lock`` (the main
process of a job takes it once, before reading or writing anything) and records its holder in
the file as JSON (``host``, ``pid``, ``started``). A second process gets ``JobLockedError``
naming the holder. The kernel releases a flock when its holder dies, so a dead holder's lock is
simply taken again (the stale record is logged); a lock still held while its recorded holder
is gone from this host (a forked child, e.g. a data-loader worker, kept the file open) is taken
over by renaming a new, locked lock file over it, with a warning. Taking, taking over and
releasing the lock happen under a short ``flock`` of the job directory itself, so the flock of
``.lock`` and its record change as one step for every other process: two commands started
together on a stale record never both hold the lock. ``flock`` is advisory and, on some network file
systems, local to a node: it guards against the mistakes of one lab (the same command started
twice), not against a hostile writer.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

LOCK_FILE = ".lock"


class JobLockedError(RuntimeError):
    """Another live process holds the job directory's lock (the message names it)."""


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists on this host (one we may not signal counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class JobLock:
    """Context manager holding the lock of ``directory`` (created if missing).

    Raises ``JobLockedError`` on entry when another live process holds it.
    """

    def __init__(self, directory: str | Path) -> None:
        self.path = Path(directory) / LOCK_FILE
        self._fd: int | None = None

    def holder(self) -> dict[str, Any]:
        """The recorded holder (``host``, ``pid``, ``started``); {} when none is recorded."""
        try:
            data = json.loads(self.path.read_text(encoding="utf-8") or "{}")
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def acquire(self) -> None:
        """Take the lock (see the module docstring for a dead holder)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with _gate(self.path.parent):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
            previous = self.holder()  # complete: every holder writes it under the gate
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                fd = self._take_over_or_refuse(previous)
            self._record(fd, previous)

    def _take_over_or_refuse(self, holder: dict[str, Any]) -> int:
        """Take the held lock over from ``holder`` (its record) when it is gone from this host
        (a new, locked lock file renamed over the old one; its descriptor is returned), else
        raise ``JobLockedError``. Called under the gate."""
        if holder.get("host") != socket.gethostname() or pid_alive(int(holder.get("pid", -1))):
            raise JobLockedError(
                f"{self.path.parent} is in use by another run: host {holder.get('host', '?')}"
                f", pid {holder.get('pid', '?')}, started {holder.get('started', '?')}. "
                "Wait for it to finish, use another output directory (hydra.run.dir), or "
                "stop that process first."
            ) from None
        logger.warning(
            "%s is held by a process that outlived its writer (pid %s, gone); taking the lock over",
            self.path,
            holder.get("pid"),
        )
        fresh = self.path.with_name(f"{LOCK_FILE}.{os.getpid()}.new")
        fd = os.open(fresh, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a new file: nobody else holds it
        os.replace(fresh, self.path)
        return fd

    def _record(self, fd: int, previous: dict[str, Any]) -> None:
        if previous:
            logger.warning(
                "%s: previous writer (host %s, pid %s, started %s) is gone; lock taken over",
                self.path,
                previous.get("host"),
                previous.get("pid"),
                previous.get("started"),
            )
        record = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(record).encode(), 0)
        os.fsync(fd)
        self._fd = fd

    def release(self) -> None:
        """Clear the record and drop the lock (a no-op when not held)."""
        if self._fd is None:
            return
        with _gate(self.path.parent):  # an acquirer never reads a record being cleared
            os.ftruncate(self._fd, 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
        self._fd = None

    def __enter__(self) -> JobLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


@contextmanager
def _gate(directory: Path) -> Iterator[None]:
    """A blocking ``flock`` on the job directory itself, held only while a lock is taken or
    released: the holder's flock and its record change together, as one step, for every other
    acquirer (without it, a loser of the race for the flock could read the stale record of a
    dead writer before the winner replaced it, and take the lock over from the winner)."""
    fd = os.open(directory, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
