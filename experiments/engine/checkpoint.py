"""Checkpoint files that are written atomically and verified when read.

A checkpoint is a plain ``torch.save`` file (any code reads it with
``torch.load(path, weights_only=True)``) plus a digest file ``<name>.sha256`` holding
``sha256=<hex> bytes=<n>``, written after it. Each is written to a temporary file in the same
directory (``<name>.<host>-<pid>.<random>.tmp``, so concurrent writers never touch each
other's), flushed, fsynced and renamed over the final name, so a reader (or a resumed run) sees
either the old file or the new one, never half a file. Reading checks the size (truncation)
and SHA-256 (silent corruption) when the digest file exists, else the CRC-32 of every member
of the zip archive ``torch.save`` writes (``torch.load`` ignores them), then unpickles with
``weights_only=True``; every failure of a file that was read is a ``CheckpointError`` naming
the file. A file that cannot be read at all (an ``OSError``) is a
``CheckpointUnreadableError``: not corrupt, just unknown, so nothing falls back or moves it.
Files of the older format (one header line
``implicit-ham-checkpoint v1 sha256=<hex> bytes=<n>`` before the payload) are still read and
verified.

``CheckpointStore`` keeps the ``keep`` newest checkpoints of a run as ``step-<step>.pt`` in one
directory; the newest is read back and verified before older ones are pruned, and ``latest()``
falls back to the newest *good* file, moving a bad one aside as ``<name>.corrupt``.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import re
import socket
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import torch

from experiments.engine.joblock import pid_alive
from experiments.engine.write_errors import writing
from implicit_ham.plugins import check_positive_int

logger = logging.getLogger(__name__)

MAGIC = b"implicit-ham-checkpoint v1"
HEADER = re.compile(rb"^implicit-ham-checkpoint v1 sha256=([0-9a-f]{64}) bytes=(\d+)$")
DIGEST = re.compile(rb"^sha256=([0-9a-f]{64}) bytes=(\d+)$")
DIGEST_SUFFIX = ".sha256"
NAME = re.compile(r"^step-(\d+)\.pt$")
TEMP_WRITER = re.compile(r"\.pt(?:\.sha256)?\.(.+)-(\d+)\.[^.]*\.tmp$")


class CheckpointError(RuntimeError):
    """A checkpoint file was read and is truncated, corrupted or not a checkpoint."""


class CheckpointUnreadableError(RuntimeError):
    """A checkpoint (or its digest file) exists but could not be read (an ``OSError``: a
    permission, a failing disk, a stale network mount): nothing is known about its content, so
    it is neither used nor moved aside; the run stops naming the file and the error."""


def sidecar(path: str | Path) -> Path:
    """``<path>.sha256``: the digest file of the checkpoint at ``path``."""
    path = Path(path)
    return path.with_name(path.name + DIGEST_SUFFIX)


def write_checkpoint(path: str | Path, payload: dict[str, Any]) -> Path:
    """Serialise ``payload`` (tensors, numbers, strings, containers) to ``path`` atomically,
    then its digest to ``<path>.sha256`` (also atomically).

    The file is a plain ``torch.save`` file (``torch.load(path, weights_only=True)`` reads it);
    an older digest file is removed before the new checkpoint replaces the old one, so a crash
    in between leaves a checkpoint without a digest (still loadable), never a wrong digest.
    Files get the mode the umask gives (as ``open`` would), not tempfile's 0600.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    data = buffer.getvalue()
    tmp = _write_temporary(path, data)
    sidecar(path).unlink(missing_ok=True)
    os.replace(tmp, path)
    record = f"sha256={hashlib.sha256(data).hexdigest()} bytes={len(data)}\n".encode()
    os.replace(_write_temporary(sidecar(path), record), sidecar(path))
    _fsync_directory(path.parent)
    return path


def _write_temporary(path: Path, data: bytes) -> str:
    """``data`` in a fsynced temporary file of this writer beside ``path``; its name."""
    with (
        writing(path),
        tempfile.NamedTemporaryFile(
            dir=path.parent, delete=False, prefix=f"{path.name}.{_writer()}.", suffix=".tmp"
        ) as fh,
    ):
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
        os.chmod(fh.name, 0o666 & ~_umask())
        return fh.name


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _writer() -> str:
    """``<host>-<pid>``: the part of a temporary file's name that says whose it is."""
    return f"{socket.gethostname()}-{os.getpid()}"


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """The payload of the checkpoint at ``path``, loaded with ``weights_only=True``.

    The size and SHA-256 recorded in ``<path>.sha256`` are checked when that file exists (a
    checkpoint of the older format, one header line before the payload, is checked against its
    header), else the CRC-32 of its zip members. Any failure of the content (truncated,
    corrupted, not a checkpoint, an unpickling error of a crafted file) raises
    ``CheckpointError`` naming the file; an ``OSError`` reading it raises
    ``CheckpointUnreadableError`` (the file may be intact).
    """
    path = Path(path)
    raw = _read(path)
    if raw.startswith(MAGIC) or (raw and MAGIC.startswith(raw)):
        data = _legacy_payload(path, raw)
    else:
        data = raw
        digest_file = sidecar(path)
        if digest_file.exists():
            _verify(path, data, _read(digest_file).strip())
        else:  # e.g. a crash between the checkpoint's rename and its digest's
            _verify_zip(path, data)
    try:
        payload = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as err:
        first = str(err).splitlines()[0] if str(err) else ""
        raise CheckpointError(
            f"{path} is not a loadable checkpoint ({type(err).__name__}: {first}); it is "
            "damaged or was not written by this project. Delete it to resume from an older one."
        ) from err
    if not isinstance(payload, dict):
        raise CheckpointError(f"{path} holds a {type(payload).__name__}, not a checkpoint dict")
    return payload


def _read(path: Path) -> bytes:
    """The bytes of ``path``; ``CheckpointUnreadableError`` naming it on an ``OSError``."""
    try:
        return path.read_bytes()
    except OSError as err:
        raise CheckpointUnreadableError(
            f"cannot read {path}: {err}. The file was not checked, used or moved aside; fix "
            "the cause (permissions, disk, mount) and run the same command again, or delete "
            "the file to resume from an older checkpoint."
        ) from err


def _verify_zip(path: Path, data: bytes) -> None:
    """Check the CRC-32 of every member of a checkpoint without a digest file (``torch.save``
    writes a zip archive; ``torch.load`` itself ignores the CRCs, so a flipped byte in a
    tensor would load silently)."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as err:
        raise CheckpointError(
            f"checkpoint {path} (no digest file) is not an intact zip archive ({err}). Delete "
            "it to resume from an older one."
        ) from err
    if bad is not None:
        raise CheckpointError(
            f"checkpoint {path} (no digest file) is corrupted: the CRC-32 of its member {bad} "
            "does not match. Delete it to resume from an older one."
        )


def _verify(path: Path, data: bytes, record: bytes) -> None:
    match = DIGEST.match(record)
    if match is None:
        raise CheckpointError(
            f"the digest file of {path} is damaged ({record[:80]!r}). Delete it (the checkpoint "
            "is then loaded unchecked) or the checkpoint to resume from an older one."
        )
    digest, size = match.group(1).decode(), int(match.group(2))
    if len(data) != size:
        raise CheckpointError(
            f"checkpoint {path} is truncated: {len(data)} of {size} payload bytes. Delete it "
            "to resume from an older one."
        )
    if hashlib.sha256(data).hexdigest() != digest:
        raise CheckpointError(
            f"checkpoint {path} is corrupted: its SHA-256 does not match the one recorded when "
            "it was written. Delete it to resume from an older one."
        )


def _legacy_payload(path: Path, raw: bytes) -> bytes:
    """The payload of an older-format checkpoint (header line, then payload), verified."""
    header, _, data = raw.partition(b"\n")
    if HEADER.match(header) is None:
        raise CheckpointError(
            f"checkpoint {path} is truncated inside its header ({len(raw)} bytes). Delete it to "
            "resume from an older one."
        )
    _verify(path, data, header[len(MAGIC) + 1 :])
    return data


def _fsync_directory(directory: Path) -> None:
    """Make a rename durable (POSIX); a no-op where directories cannot be opened."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        logger.debug("fsync of directory %s not supported", directory)
    finally:
        os.close(fd)


class CheckpointStore:
    """The checkpoints of one run: ``directory/step-<step>.pt``, the ``keep`` newest kept.

    Args:
        directory: where the files live (created on the first save).
        keep: how many checkpoints to keep (>= 1; 2 keeps a previous good one beside the
            newest).
    """

    def __init__(self, directory: str | Path, keep: int = 2) -> None:
        check_positive_int("CheckpointStore", "keep", keep)
        self.directory = Path(directory)
        self.keep = keep

    def paths(self) -> list[Path]:
        """The checkpoint files present, oldest first (by step)."""
        if not self.directory.is_dir():
            return []
        found = [
            (int(m.group(1)), p) for p in self.directory.iterdir() if (m := NAME.match(p.name))
        ]
        return [p for _, p in sorted(found)]

    def save(self, step: int, payload: dict[str, Any]) -> Path:
        """Write the checkpoint of ``step``, verify it on disk, then prune the oldest files."""
        path = write_checkpoint(self.directory / f"step-{step:09d}.pt", payload)
        read_checkpoint(path)
        for old in self.paths()[: -self.keep]:
            old.unlink(missing_ok=True)
            sidecar(old).unlink(missing_ok=True)
        return path

    def latest(self) -> tuple[Path, dict[str, Any]] | None:
        """The newest checkpoint that verifies, with its payload; None when there is none.

        A file that fails verification is logged (error, naming it), renamed to
        ``<name>.corrupt`` and skipped; temporary files of an interrupted write by this
        process or by a dead one of this host are removed (``remove_own_partials``). Raises
        ``CheckpointError`` naming every bad file when checkpoints exist but none verifies.
        """
        self.remove_own_partials()
        bad: list[str] = []
        for path in reversed(self.paths()):
            try:
                return path, read_checkpoint(path)
            except CheckpointError as err:
                logger.error("%s (moved aside to %s.corrupt; trying an older one)", err, path.name)
                bad.append(str(err))
                path.replace(path.with_name(path.name + ".corrupt"))
                if sidecar(path).exists():
                    sidecar(path).replace(sidecar(path.with_name(path.name + ".corrupt")))
        if bad:
            raise CheckpointError(
                "no usable checkpoint in "
                f"{self.directory}: "
                + " | ".join(bad)
                + " Start over with reliability.resume=false or restore a good file."
            )
        return None

    def remove_own_partials(self) -> None:
        """Delete the temporary files (``<name>[.sha256].<host>-<pid>.<random>.tmp``) of this
        process and of processes of this host that are gone; another live writer's are left
        alone."""
        if not self.directory.is_dir():
            return
        host = socket.gethostname()
        for partial in self.directory.glob("*.tmp"):
            match = TEMP_WRITER.search(partial.name)
            if match is None or match.group(1) != host:
                continue
            pid = int(match.group(2))
            if pid == os.getpid() or not pid_alive(pid):
                partial.unlink(missing_ok=True)

    def clear(self) -> None:
        """Delete every checkpoint file (e.g. when a run starts over in the same directory)."""
        for path in self.paths():
            path.unlink()
            sidecar(path).unlink(missing_ok=True)
