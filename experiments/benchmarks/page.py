"""Regenerate the measured part of ``docs/benchmarks.md`` from the benchmark scripts.

    python -m experiments.bench page                          # the full run (~30 min on 2
    cores)
    python -m experiments.bench page --bench "--sizes 32 64"  # a quicker one

Runs ``experiments.bench`` and ``experiments.benchmarks.adjoints`` with the given arguments and
rewrites the page below ``MARKER``: each command line and its output. The hand-written part above
the marker (method, reading of the numbers) is kept as it is.
"""

from __future__ import annotations

import argparse
import io
import logging
import shlex
from collections.abc import Callable, Sequence
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

from experiments.benchmarks import adjoints as bench_adjoints
from experiments.benchmarks import blocks as bench
from experiments.reports.render import render

logger = logging.getLogger("experiments.benchmarks.page")
MARKER = (
    "<!-- generated below by `python -m experiments.bench page`; edit above this line only -->"
)
DEFAULT_PAGE = Path(__file__).resolve().parents[2] / "docs" / "benchmarks.md"
DEFAULT_BENCH = "--sizes 32 64 96 128 --threads 1 --clock cpu --compile"
DEFAULT_ADJOINTS = "--threads 1 --clock cpu"


def captured(main: Callable[[list[str]], Any], argv: list[str]) -> str:
    """What ``main(argv)`` prints."""
    with redirect_stdout(io.StringIO()) as out:
        main(argv)
    return out.getvalue().strip("\n")


def tables_section(runs: Sequence[tuple[str, str]]) -> str:
    """Markdown for (command line, its output) pairs: the command, then the output verbatim
    (``templates/benchmarks/tables.md.j2`` under ``experiments/reports``)."""
    return render("benchmarks/tables.md.j2", runs=runs)


def write_page(path: str | Path, runs: Sequence[tuple[str, str]]) -> Path:
    """Replace everything below ``MARKER`` in the page at ``path`` by the tables of ``runs``."""
    path = Path(path)
    text = path.read_text()
    if MARKER not in text:
        raise ValueError(
            f"{path} has no marker line {MARKER!r}; add it below the page's hand-written part"
        )
    head = text.split(MARKER, 1)[0]
    path.write_text(f"{head}{MARKER}\n\n{tables_section(runs)}")
    return path


def main(argv: Sequence[str] | None = None) -> Path:
    """Run both benchmarks and rewrite the page; return its path."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(DEFAULT_PAGE), help="the page to rewrite")
    parser.add_argument("--bench", default=DEFAULT_BENCH, help="arguments of experiments.bench")
    parser.add_argument(
        "--adjoints", default=DEFAULT_ADJOINTS, help="arguments of experiments.benchmarks.adjoints"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    runs = []
    parts = (
        ("experiments.bench", bench, args.bench),
        ("experiments.bench adjoints", bench_adjoints, args.adjoints),
    )
    for name, module, options in parts:
        command = f"python -m {name} {options}".strip()
        logger.info("running %s", command)
        runs.append((command, captured(module.main, shlex.split(options))))
    path = write_page(args.out, runs)
    logger.info("wrote %s", path)
    return path


if __name__ == "__main__":
    main()
