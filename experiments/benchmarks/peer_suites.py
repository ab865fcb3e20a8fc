"""The peers' own test cases and the Moré-Garbow-Hillstrom set: run them, write JSON, render
``docs/peer_suites.md``.

    python -m experiments.benchmarks.peer_suites run   # both -> docs/peer_suites/results.json
    python -m experiments.benchmarks.peer_suites page  # the page from that JSON

``run`` runs every case of ``implicit_ham.testing.peer_cases`` (the slow ones included) with
the peer's solver mapped to ours, and the MGH set through ours (float64, float32) and SciPy
(``experiments.benchmarks.mgh_suite``); ``page`` writes the page from the JSON alone (the page
is never hand-edited: regenerate it).
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import time
from pathlib import Path
from typing import Any

import scipy
import torch

from experiments.benchmarks import mgh_suite
from experiments.benchmarks.peer_suites_page import write_page
from implicit_ham.testing.peer_cases import all_cases, run_case
from implicit_ham.testing.report import CheckFailedError, NotApplicableError

logger = logging.getLogger("experiments.benchmarks.peer_suites")
ROOT = Path(__file__).resolve().parents[2]
DEFAULT_JSON = ROOT / "docs" / "peer_suites" / "results.json"
DEFAULT_PAGE = ROOT / "docs" / "peer_suites.md"


def run_peer_cases() -> list[dict[str, Any]]:
    """Every peer case: its identity, status ("passed", "failed", "not applicable"), the
    measured numbers, the reason / failure message and the seconds it took."""
    rows = []
    for case in all_cases():
        start = time.perf_counter()
        measured: dict[str, float] = {}
        try:
            measured, status, detail = run_case(case), "passed", case.reason
        except NotApplicableError as skip:
            status, detail = "not applicable", str(skip)
        except CheckFailedError as failure:
            measured, status, detail = failure.measured, "failed", str(failure)
        except Exception as err:  # a crash is a failed case, named
            status, detail = "failed", f"raised {type(err).__name__}: {err}"
        rows.append(
            {
                "peer": case.peer,
                "source": case.source,
                "name": case.name,
                "status": status,
                "detail": detail,
                "measured": measured,
                "expected_failure": case.expected_failure,
                "seconds": time.perf_counter() - start,
            }
        )
        logger.info("%s %s: %s", case.peer, case.name, status)
    return rows


def run(out: Path, peers: bool = True, mgh: bool = True) -> dict[str, Any]:
    """Run the suites and write the JSON (a suite not run keeps its previous rows)."""
    data: dict[str, Any] = json.loads(out.read_text()) if out.exists() else {}
    data["meta"] = {
        "torch": torch.__version__,
        "scipy": scipy.__version__,
        "python": platform.python_version(),
        "threads": torch.get_num_threads(),
        "machine": platform.machine(),
        "command": "python -m experiments.benchmarks.peer_suites run",
    }
    if peers:
        data["peer_cases"] = run_peer_cases()
    if mgh:
        data["mgh"] = mgh_suite.as_dicts(mgh_suite.run())
        data["mgh_tau"] = {str(k).replace("torch.", ""): v for k, v in mgh_suite.TAU.items()}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return data


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=("run", "page"))
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    parser.add_argument("--page", type=Path, default=DEFAULT_PAGE)
    parser.add_argument("--no-peers", action="store_true", help="run: leave the peer cases")
    parser.add_argument("--no-mgh", action="store_true", help="run: leave the MGH set")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.what == "run":
        run(args.json, peers=not args.no_peers, mgh=not args.no_mgh)
    write_page(json.loads(args.json.read_text()), args.page)
    logger.info("wrote %s", args.page)


if __name__ == "__main__":
    main()
