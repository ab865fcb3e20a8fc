"""Write ``docs/generation.md`` from a sweep of ``experiments.generate``:
``python -m experiments.report --generation [SWEEP_DIR] [--out docs/generation.md]``
(default sweep: ``multirun/generate``, the one ``make generate`` runs). Figures go to
``docs/generation/``.
"""

from __future__ import annotations

import argparse
import logging

from experiments.generation.report import write_generation_report

COMMAND = "make generate   # = the sweep below, then this report\n" + (
    "python -m experiments.generation.classifier multirun/generate/classifier.pt\n"
    "python -m experiments.generate -m +experiment=generation\n"
    "python -m experiments.report --generation multirun/generate"
)


def main(argv: list[str] | None = None) -> None:
    """Parse the command line and write the report."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("sweep_dir", nargs="?", default="multirun/generate")
    parser.add_argument("--out", default="docs/generation.md")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    write_generation_report(args.sweep_dir, args.out, COMMAND)


if __name__ == "__main__":
    main()
