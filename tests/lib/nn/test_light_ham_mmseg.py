"""``LightHamHead`` against mmsegmentation's own ``LightHamHead``, run in a separate test-only
virtualenv (``tests/helpers/mmseg_light_ham_run.py`` says how to make it; the interpreter is
``$IMPLICIT_HAM_MMSEG_PYTHON``, else ``/tmp/mmseg/bin/python``). Skipped when there is none;
``test_light_ham_head.py`` checks the same computation against an independent
re-implementation in every run.

One subprocess builds mmseg's head in the SegNeXt-T configuration (GroupNorm(32), R = 16) in
float64 and returns its state dict, parameter count, an evaluation with its fixed bases
(``rand_init=False``) and a seeded training forward / backward. The state dict is loaded into
this library's head through ``mmseg_state_dict`` (so the key conversion is checked on mmseg's
real names) and both computations are repeated here: outputs and gradients agree to 1e-10.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch

import implicit_ham as ih
from implicit_ham.nn import mmseg_state_dict, segnext_nmf

HELPER = Path(__file__).resolve().parents[2] / "helpers" / "mmseg_light_ham_run.py"
PYTHON = Path(os.environ.get("IMPLICIT_HAM_MMSEG_PYTHON", "/tmp/mmseg/bin/python"))
CONFIG = dict(
    in_channels=[64, 160, 256],
    in_index=[1, 2, 3],
    channels=256,
    ham_channels=256,
    dropout_ratio=0.1,
    num_classes=150,
    align_corners=False,
)
SEGNEXT_T_PARAMETERS = 359_830  # measured on mmseg's head: see the last test


def _has_mmseg() -> bool:
    if not PYTHON.exists():
        return False
    probe = subprocess.run(
        [str(PYTHON), "-c", "import importlib.util as u; assert u.find_spec('mmseg')"],
        capture_output=True,
    )
    return probe.returncode == 0


pytestmark = pytest.mark.skipif(
    not _has_mmseg(), reason=f"no interpreter with mmsegmentation at {PYTHON}"
)


@pytest.fixture(scope="module")
def mmseg_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    generator = torch.Generator().manual_seed(0)
    # strides 4, 8, 16, 32 of a 64 x 64 image; the last level odd-sized (a non-integer resize)
    shapes = [(32, 32, 32), (64, 16, 16), (160, 8, 8), (256, 4, 5)]
    inputs = [torch.rand(2, *s, generator=generator, dtype=torch.float64) for s in shapes]
    weight = torch.randn(2, 150, 16, 16, generator=generator, dtype=torch.float64)
    folder = tmp_path_factory.mktemp("mmseg")
    payload = dict(config=CONFIG, rank=16, inputs=inputs, weight=weight, init_seed=1, train_seed=7)
    torch.save(payload, folder / "payload.pt")
    done = subprocess.run(
        [str(PYTHON), str(HELPER), str(folder / "payload.pt"), str(folder / "result.pt")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return {**payload, **torch.load(folder / "result.pt")}


def _ours(run: dict[str, Any]) -> ih.LightHamHead:
    config = {k: v for k, v in CONFIG.items() if k not in ("in_channels", "channels")}
    head = ih.LightHamHead(
        CONFIG["in_channels"],
        CONFIG["channels"],
        ham=segnext_nmf(256, eval_init="fixed"),
        **config,
    ).double()
    head.load_state_dict(mmseg_state_dict(run["state"]), strict=True)
    return head


def test_evaluation_with_mmseg_bases_equals_mmseg(mmseg_run: dict[str, Any]) -> None:
    head = _ours(mmseg_run).eval()
    with torch.no_grad():
        out = head(mmseg_run["inputs"])
    assert out.shape == mmseg_run["eval"].shape == (2, 150, 16, 16)
    error = (out - mmseg_run["eval"]).abs().max().item()
    print(f"mmseg parity, evaluation (fixed bases): max |difference| = {error:.3e}")
    assert error <= 1e-10


def test_training_forward_and_gradients_equal_mmseg(mmseg_run: dict[str, Any]) -> None:
    head = _ours(mmseg_run).train()
    leaves = [t.clone().requires_grad_() for t in mmseg_run["inputs"]]
    torch.manual_seed(mmseg_run["train_seed"])  # same bases, then the same dropout mask
    out = head(leaves)
    (out * mmseg_run["weight"]).sum().backward()
    errors = {"output": (out - mmseg_run["train"]).abs().max().item()}
    for i, (leaf, reference) in enumerate(zip(leaves, mmseg_run["input_grads"], strict=True)):
        if reference is None:  # level 0 is not selected: no gradient in either head
            assert leaf.grad is None
            continue
        errors[f"input {i}"] = (leaf.grad - reference).abs().max().item()
    grads = mmseg_state_dict(mmseg_run["param_grads"])
    named = dict(head.named_parameters())
    assert set(grads) == set(named)
    for name, parameter in named.items():
        errors[name] = (parameter.grad - grads[name]).abs().max().item()
    print("mmseg parity, training:", {k: f"{v:.2e}" for k, v in errors.items()})
    assert max(errors.values()) <= 1e-10, errors


def test_segnext_t_parameter_count_is_mmseg_s(mmseg_run: dict[str, Any]) -> None:
    assert mmseg_run["param_count"] == SEGNEXT_T_PARAMETERS
    assert sum(p.numel() for p in _ours(mmseg_run).parameters()) == SEGNEXT_T_PARAMETERS
