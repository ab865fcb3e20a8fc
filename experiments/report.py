"""Report a sweep: ``python -m experiments.report MULTIRUN_DIR [--out DIR] [--metrics ...]``.

Writes ``report.md`` (mean ± std over seeds per configuration, failed jobs) and PNG plots.
"""

from __future__ import annotations

import argparse
import logging

from implicit_ham.experiment.report import write_report

logger = logging.getLogger("experiments.report")


def main(argv: list[str] | None = None) -> None:
    """Parse the command line and write the report."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("sweep_dir", help="multirun folder holding the numbered job folders")
    parser.add_argument("--out", default=None, help="output folder (default: the sweep folder)")
    parser.add_argument("--metrics", nargs="*", default=None, help="metrics to tabulate")
    parser.add_argument("--title", default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    path = write_report(args.sweep_dir, args.out, args.metrics, args.title)
    logger.info("report: %s", path)
    logger.info("%s", path.read_text())


if __name__ == "__main__":
    main()
