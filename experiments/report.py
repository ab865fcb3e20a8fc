"""Report runs.

* ``python -m experiments.report MULTIRUN_DIR [--out DIR] [--metrics ...] [--title ...]``: one
  sweep -> ``report.md`` (mean ± std over seeds per configuration, failed jobs) and PNG plots.
* ``python -m experiments.report --deq [CSV] [--out docs/deq_training.md]``: the DEQ
  training study of ``make deq-study`` from its committed rows alone (default
  ``docs/deq_training/runs.csv``) -> ``docs/deq_training.md`` and its curves in
  ``docs/deq_training/``.
* ``python -m experiments.report --study [STUDY_DIR] [--out docs]``: the whole study
  (default ``multirun/study``, written by ``experiments/scripts/study.sh``) -> ``results.md``, its
  figures and ``results/findings.md`` (the verdicts alone, included by ``docs/index.md``), with
  the study script quoted at the top.

Study v4's section of ``results.md`` has its own command,
``python -m experiments.studies.paper_v4.report``.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from experiments.reports.sweep import write_report
from experiments.reports.sweep_metrics import UnknownMetricError
from experiments.studies.deq_training.report import write_deq_report
from experiments.studies.legend_seg.report import write_study_report

logger = logging.getLogger("experiments.report")
STUDY_SCRIPT = Path(__file__).parent / "scripts" / "study.sh"


def main(argv: list[str] | None = None) -> None:
    """Parse the command line and write the report."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("sweep_dir", nargs="?", default=None, help="multirun or study folder")
    parser.add_argument("--out", default=None, help="output folder (default: the sweep folder)")
    parser.add_argument(
        "--metrics",
        nargs="*",
        default=None,
        help="metrics to tabulate: any key of results.json's metrics or of metrics.jsonl "
        "(gradient norms, solver and backward statistics); an unknown name is an error",
    )
    parser.add_argument("--title", default=None)
    parser.add_argument("--study", action="store_true", help="write the study's results.md")
    parser.add_argument(
        "--deq", action="store_true", help="write docs/deq_training.md from the DEQ study's CSV"
    )
    parser.add_argument("--commands", default=str(STUDY_SCRIPT), help="script quoted by --study")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.deq:
        path = write_deq_report(
            args.sweep_dir or "docs/deq_training/runs.csv", args.out or "docs/deq_training.md"
        )
        logger.info("DEQ training report: %s", path)
        return
    if args.study:
        commands = Path(args.commands).read_text()
        path = write_study_report(args.sweep_dir or "multirun/study", args.out or "docs", commands)
        logger.info("study report: %s", path)
        return
    if args.sweep_dir is None:
        parser.error("give the multirun folder to report (or --study)")
    try:
        path = write_report(args.sweep_dir, args.out, args.metrics, args.title)
    except UnknownMetricError as err:
        parser.error(str(err))  # exit status 2, nothing written
    logger.info("report: %s", path)
    logger.info("%s", path.read_text())


if __name__ == "__main__":
    main()
