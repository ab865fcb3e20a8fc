"""``python tests/helpers/poisoned_train.py FAULT JOB_DIR [train overrides]``: the training job
of ``experiments.train`` in ``JOB_DIR`` (the real command, run with ``runpy``), whose training
set has one poisoned image (index ``POISONED``, every epoch):

* ``nan_image``: one pixel of the image is NaN;
* ``huge_image``: the image is ``±1e30`` (alternating signs, finite in float32), so a batch's
  variance overflows and a BatchNorm running variance becomes inf.

The validation set is left clean."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

ROOT = Path(__file__).resolve().parents[2]
POISONED = 3
FAULTS = ("nan_image", "huge_image")


class Poisoned(Dataset[Any]):
    """``dataset`` with item ``POISONED``'s image replaced by ``fault``'s."""

    def __init__(self, dataset: Dataset[Any], fault: str) -> None:
        self.dataset, self.fault = dataset, fault

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> tuple[torch.Tensor, Any]:
        image, target = self.dataset[index]
        if index != POISONED:
            return image, target
        image = image.clone()
        if self.fault == "nan_image":
            image.view(-1)[0] = float("nan")
        else:
            signs = torch.ones(image.numel()).index_fill_(0, torch.arange(1, image.numel(), 2), -1)
            image = (signs * 1e30).reshape(image.shape).to(image.dtype)
        return image, target


def main() -> None:
    fault, job = sys.argv[1], Path(sys.argv[2])
    if fault not in FAULTS:
        raise SystemExit(f"poisoned_train.py: FAULT must be one of {FAULTS}, got {fault!r}")
    sys.path.insert(0, str(ROOT))
    from experiments.engine import run

    build = run.build_datasets

    def poisoned(*args: Any, **kwargs: Any) -> Any:
        train, val, info = build(*args, **kwargs)
        return Poisoned(train, fault), val, info

    run.build_datasets = poisoned  # type: ignore[assignment]
    sys.argv = ["experiments.train", *sys.argv[3:], f"hydra.run.dir={job}"]
    runpy.run_module("experiments.train", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
