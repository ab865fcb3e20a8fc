"""Print the directory of the sweep job with given overrides:
``python -m experiments.find_job MULTIRUN_DIR key=value ...`` (exactly one job must match)."""

from __future__ import annotations

import argparse
import sys

from experiments.reports.sweep_jobs import find_job


def main(argv: list[str] | None = None) -> None:
    """Parse ``key=value`` pairs and print the matching job's directory."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("sweep_dir")
    parser.add_argument("overrides", nargs="+", help="key=value, as on the sweep's command line")
    args = parser.parse_args(argv)
    pairs = [item.partition("=") for item in args.overrides]
    if any(not sep for _, sep, _ in pairs):
        parser.error("every override must be key=value")
    sys.stdout.write(f"{find_job(args.sweep_dir, **{k: v for k, _, v in pairs}).directory}\n")


if __name__ == "__main__":
    main()
