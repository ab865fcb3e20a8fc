"""Runs mmsegmentation's own ``LightHamHead`` for the parity test (test_light_ham_mmseg.py).

Executed by the interpreter of a separate, test-only virtualenv that has mmsegmentation (it is
not a dependency of implicit-ham)::

    python3 -m venv /tmp/mmseg
    /tmp/mmseg/bin/pip install torch mmengine mmcv-lite mmsegmentation ftfy regex

Usage: ``python mmseg_light_ham_run.py PAYLOAD RESULT``. PAYLOAD (``torch.save``) holds the
head's config, the float64 inputs, the loss weight and the training seed; RESULT receives the
head's state dict (mmseg's names), its parameter count, the evaluation output (fixed initial
bases: ``rand_init=False``), and the training output with its input and parameter gradients
(random bases drawn after ``torch.manual_seed(seed)``, as the head draws them).

Importing the head needs care: ``import mmseg`` refuses mmcv-lite 2.2 by version, and
``mmseg.models`` imports every model (some need mmcv's compiled ops, absent from mmcv-lite). So
the packages ``mmseg``, ``mmseg.models`` and ``mmseg.models.decode_heads`` are entered as empty
package shells pointing at their folders (their ``__init__`` does not run), and ``mmcv.ops``
as a module whose every attribute is a placeholder class (only imported, never called here).
This script imports nothing from implicit_ham.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from pathlib import Path
from typing import Any


def import_light_ham_head() -> Any:
    """mmseg's ``LightHamHead`` class, without running mmseg's package initialisers."""
    spec = importlib.util.find_spec("mmseg")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("mmsegmentation is not installed in this interpreter")
    root = Path(next(iter(spec.submodule_search_locations)))
    for name, folder in (
        ("mmseg", root),
        ("mmseg.models", root / "models"),
        ("mmseg.models.decode_heads", root / "models" / "decode_heads"),
    ):
        shell = types.ModuleType(name)
        shell.__path__ = [str(folder)]
        sys.modules[name] = shell
    ops = types.ModuleType("mmcv.ops")

    def placeholder(name: str) -> type:
        if name.startswith("__"):
            raise AttributeError(name)
        return type(name, (), {})

    ops.__getattr__ = placeholder  # type: ignore[method-assign]
    sys.modules["mmcv.ops"] = ops
    return importlib.import_module("mmseg.models.decode_heads.ham_head").LightHamHead


def main(payload_path: str, result_path: str) -> None:
    import torch

    payload = torch.load(payload_path)
    torch.set_default_dtype(torch.float64)  # the head draws its bases in the default dtype
    head_class = import_light_ham_head()
    torch.manual_seed(payload["init_seed"])
    config = dict(payload["config"])
    head = head_class(
        **config,
        ham_kwargs=dict(MD_R=payload["rank"], rand_init=False),
        norm_cfg=dict(type="GN", num_groups=32, requires_grad=True),
        loss_decode=dict(type="CrossEntropyLoss", use_sigmoid=False, loss_weight=1.0),
    )
    head.init_weights()
    count = sum(p.numel() for p in head.parameters())
    inputs = [t.clone() for t in payload["inputs"]]
    head.eval()
    with torch.no_grad():
        evaluated = head(inputs)  # rand_init=False: registers its bases buffer on this call
    head.train()
    head.hamburger.ham.rand_init = True
    leaves = [t.clone().requires_grad_() for t in payload["inputs"]]
    torch.manual_seed(payload["train_seed"])
    trained = head(leaves)
    (trained * payload["weight"]).sum().backward()
    torch.save(
        {
            "state": {k: v.detach().clone() for k, v in head.state_dict().items()},
            "param_count": count,
            "eval": evaluated,
            "train": trained.detach(),
            "input_grads": [t.grad for t in leaves],
            "param_grads": {k: p.grad for k, p in head.named_parameters()},
        },
        result_path,
    )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
