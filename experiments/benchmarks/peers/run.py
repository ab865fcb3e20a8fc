"""The library side by side with its peers, in one process: issue 15's targets, each with its ratio.

Peers, all run in the same process and the same interleaved rounds as the library's code:

* the official Hamburger formulation of the NMF / VQ / CD hams
(``experiments.benchmarks.peers.official_hams``,
  a plain re-implementation of the official code's equations: ``torch.bmm`` loops,
  ``F.normalize``, softmax, ``no_grad`` over the K steps, then ``compute_coef`` with gradient);
* torchdeq 0.1.0 (a dependency): its Anderson and Broyden solvers on a dense and a convolutional
  DEQ, and a whole DEQ training step with ``get_deq(ift=True)``;
* the previous GMRES of this library (a growing list of basis vectors stacked four times per
  Arnoldi step, ``torch.linalg.lstsq`` and two host reads per step), kept here as
  ``StackedGMRES`` to measure one backward solve on the README's NMF problem.

Every ratio is peer time / library time (above 1: the library is faster), from medians over
``--rounds`` interleaved rounds on one thread (``--threads``). For the hams it also reports the
matmul floor: the same matrix products as the official formulation (recorded from it with a
dispatch mode and replayed on tensors of the same shapes and strides), timed in the same
rounds; ``floor/ours`` says how close a ham gets to it. Memory: bytes autograd saves for the
backward pass of a training step, library over peer.

    python -m experiments.benchmarks.peers.run                              # all targets, ~5 min
    python -m experiments.benchmarks.peers.run --markdown docs/benchmarks_peers.md   # also the docs
    page
    python -m experiments.benchmarks.peers.run --only hams --sizes 64           # one group
    python -m experiments.benchmarks.peers.run --json runs/1/peers.json          # the rows as JSON

Before timing, every case checks that both sides compute the same thing: the hams' outputs and
input gradients from the same initial bases (``check_same``: relative difference below the
case's tolerance, else ``SystemExit`` naming the case), the solvers' residuals, the DEQ step's
dL/dW.

**The JSON row format** (``--json``), shared by every section of the peer page, whichever
virtualenv produced it (this module; ``experiments.benchmarks.peers.loops`` in the TorchOpt
virtualenv; the optimisation-layer sections for Theseus / TorchOpt in their own files): one
file per section run,

    {"section": "hams",                       # a short name of the section
     "meta": {"command": "...", "torch": "2.13.0+cpu", "threads": 1, "clock": "cpu",
              "rounds": 15, "load": "load average: ...", "python": "/path/to/bin/python"},
     "rows": [{"target": "1. NMF ham forward", "case": "1x512x64^2 r64 K6",
               "peer": "official formulation", "ours_ms": 59.1, "peer_ms": 57.2,
               "ratio": 0.97, "goal": ">= 1.1", "met": "yes" | "no", "notes": "...",
               "floor_ms": 61.8,             # optional: the matmul floor
               "ratio_iqr": [0.95, 0.99]}]}  # optional: quartiles of the per-round ratios

``ratio`` is peer / ours for a time (above 1: ours is faster) and ours / peer for a memory row
(``goal`` then reads ``<= 1``); ``met`` compares it with ``goal``. ``ratio_iqr``, where both
times are ``peers_rows.Timing``s of one interleaved ``medians`` call, holds the first and third
quartiles of the per-round ratios (in the ratio's direction). A row is identified on the page
by ``(target, case, peer)``; ``write_json`` writes a section, ``read_json`` reads one, and
``python -m experiments.bench page --peers-runs DIR1 DIR2`` merges every ``*.json`` of each
run's folder into ``docs/benchmarks_peers.md`` with the runs' ratios side by side
(``experiments.benchmarks.page.write_peer_page``).

The sections live in ``peers_hams`` (hams, memory), ``peers_deq`` (solvers, accuracy, DEQ
training step) and ``peers_gmres``; this module runs them and writes the table.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

import implicit_ham as ih
from experiments.benchmarks.peers.deq import measure_accuracy, measure_deq_train, measure_solvers
from experiments.benchmarks.peers.gmres import measure_gmres
from experiments.benchmarks.peers.hams import measure_hams, measure_memory
from experiments.benchmarks.peers.rows import (
    CLOCK,
    Table,
    _clock,
    run_meta,
    write_json,
)
from experiments.reports.render import Table as MarkdownTable
from experiments.reports.render import render_beside

GROUPS = ("hams", "memory", "solvers", "accuracy", "gmres", "deq_train")


@dataclass(frozen=True)
class PeerPage:
    """What the page and the console say: the command line, the set-up (torch version,
    threads, clock, rounds) and the table."""

    command: str
    torch: str
    threads: int
    clock: str
    rounds: int
    table: MarkdownTable


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10, help="interleaved rounds (median)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 128], help="ham H = W")
    parser.add_argument("--only", nargs="+", choices=GROUPS, default=list(GROUPS))
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--clock", choices=list(CLOCK), default="cpu", help="process CPU or wall")
    parser.add_argument("--markdown", default=None, help="also write the table as a page here")
    parser.add_argument("--json", default=None, help="also write the rows (JSON row format)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> Table:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    _clock[0] = CLOCK[args.clock]
    table = Table()
    warnings.simplefilter("ignore", ih.ConvergenceWarning)  # NMF's GMRES: expected, see README
    if "hams" in args.only:
        measure_hams(table, args.sizes, args.rounds)
    if "memory" in args.only:
        measure_memory(table, args.sizes)
    if "solvers" in args.only:
        measure_solvers(table, args.rounds)
    if "accuracy" in args.only:
        measure_accuracy(table)
    if "gmres" in args.only:
        measure_gmres(table, args.rounds)
    if "deq_train" in args.only:
        measure_deq_train(table, args.rounds)
    words = sys.argv[1:] if argv is None else list(argv)
    command = " ".join(["python -m experiments.benchmarks.peers.run", *words])
    page = PeerPage(
        command, torch.__version__, args.threads, args.clock, args.rounds, table.as_table()
    )
    print(render_beside(__file__, "console.txt.j2", page=page), end="")
    if args.json:
        meta = run_meta(command, args.threads, args.clock, args.rounds)
        write_json(args.json, "peers", table, meta)
    if args.markdown:
        Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
        Path(args.markdown).write_text(render_beside(__file__, "page.md.j2", page=page))
    return table


if __name__ == "__main__":
    main()
