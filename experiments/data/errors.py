"""The error raised when a dataset on disk is missing or malformed, showing the layout expected."""

from __future__ import annotations

from pathlib import Path


class DataLayoutError(ValueError):
    """A data root is missing, incomplete or holds a malformed file.

    The message names the problem, the path involved, how to fix it, and the directory tree
    the loader expects, so that a user can compare it with what is on disk.
    """

    def __init__(self, problem: str, path: Path | str, fix: str, expected_layout: str) -> None:
        self.problem = problem
        self.path = Path(path)
        self.expected_layout = expected_layout
        super().__init__(
            f"{problem}: {self.path}\nFix: {fix}\nExpected layout:\n{expected_layout.rstrip()}"
        )
