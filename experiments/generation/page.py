"""Write ``docs/generation.md`` from the results file of ``experiments.generation.study``:
``python -m experiments.generation.page [SWEEP_DIR] [--results FILE] [--out docs/generation.md]``
(also ``python -m experiments.report --generation``). Figures go to ``docs/generation/``.
"""

from __future__ import annotations

import argparse
import logging

from experiments.generation.report import write_generation_report
from experiments.generation.study import RESULTS

COMMAND = "make generate   # = the commands below\n" + (
    "python -m experiments.generation.study pilot multirun/generate_v2 --results "
    f"{RESULTS}\n"
    "python -m experiments.generation.study main multirun/generate_v2 --results "
    f"{RESULTS}\n"
    f"python -m experiments.generation.page multirun/generate_v2 --results {RESULTS}"
)


def main(argv: list[str] | None = None) -> None:
    """Parse the command line and write the report."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("sweep_dir", nargs="?", default="multirun/generate_v2")
    parser.add_argument("--results", default=RESULTS)
    parser.add_argument("--out", default="docs/generation.md")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    write_generation_report(args.sweep_dir, args.out, COMMAND, args.results)


if __name__ == "__main__":
    main()
