"""Pretrain the digit_seg backbone once: ``python -m experiments.pretrain --out PATH [options]``.

Writes the artefact every paper-regime arm loads (``model.pretrained=PATH``); an artefact that
exists with the same options is kept (a finished pretraining is never repeated), one with other
options is an error. The logic lives in ``experiments.studies.pretraining``.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging

import torch

from experiments.studies.pretraining import PretrainConf, ensure_pretrained


def main(argv: list[str] | None = None) -> None:
    """Parse the options (one per ``PretrainConf`` field) and pretrain or reuse."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True, help="artefact path, e.g. .../backbone.pt")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    for field in dataclasses.fields(PretrainConf):
        kind = int if field.default is None else type(field.default)  # scan_seed: int | None
        parser.add_argument(f"--{field.name.replace('_', '-')}", type=kind,
                            default=field.default)  # fmt: skip
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(args.threads)
    conf = PretrainConf(**{f.name: getattr(args, f.name) for f in dataclasses.fields(PretrainConf)})
    ensure_pretrained(args.out, conf)


if __name__ == "__main__":
    main()
