"""The benchmarks: ``python -m experiments.bench [PART] [OPTIONS]``.

PART is one of

* ``blocks`` (the default, also when the first argument is an option): Hamburger blocks against
  attention, time / FLOPs / saved bytes / peak memory (``experiments.benchmarks.blocks``);
* ``adjoints``: the backward modes on one block (``experiments.benchmarks.adjoints``);
* ``compile``: compiled against eager, graph breaks (``experiments.benchmarks.compiled``);
* ``diagnostics``: the cost of the diagnostics (``experiments.benchmarks.diagnostics``);
* ``peers``: against the official Hamburger code, torchdeq and TorchOpt
  (``experiments.benchmarks.peers.run``);
* ``sequence``: token mixers (ham, SDPA and linear attention) against the sequence length
  (``experiments.benchmarks.sequence_cost``; writes docs/benchmarks_sequence.md);
* ``page``: reruns ``blocks`` and ``adjoints`` and rewrites docs/benchmarks.md
  (``experiments.benchmarks.page``; ``make bench``).

``python -m experiments.bench PART --help`` lists a part's options.
"""

from __future__ import annotations

import importlib
import sys

PARTS = {
    "blocks": "blocks",
    "adjoints": "adjoints",
    "compile": "compiled",
    "diagnostics": "diagnostics",
    "peers": "peers.run",
    "sequence": "sequence_cost",
    "page": "page",
}


def main(argv: list[str] | None = None) -> None:
    """Dispatch to the benchmark named by the first argument (default ``blocks``)."""
    args = list(sys.argv[1:] if argv is None else argv)
    part = "blocks"
    if args and not args[0].startswith("-"):
        part = args.pop(0)
    if part not in PARTS:
        raise SystemExit(
            f"experiments.bench: unknown part {part!r}; choose one of {', '.join(PARTS)}"
        )
    module = importlib.import_module(f"experiments.benchmarks.{PARTS[part]}")
    module.main(args)


if __name__ == "__main__":
    main()
