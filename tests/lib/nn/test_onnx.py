"""ONNX export (``torch.onnx.export(..., dynamo=True)``) of a Hamburger block and of the
``LightHamHead`` in evaluation mode with a fixed number of iterations and ``eval_init="fixed"``:
onnxruntime's outputs equal PyTorch's within 1e-5. The modes docs/light_ham_head.md says do not
export are checked to fail (or, for random bases, to differ), so the page stays true."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import implicit_ham as ih
from implicit_ham.nn import segnext_nmf

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")


def run_onnx(module: nn.Module, inputs: tuple, folder: Path) -> list[np.ndarray]:
    """Export ``module(*inputs)``, run it in onnxruntime on the same inputs (flattened)."""
    program = torch.onnx.export(module, inputs, dynamo=True, verbose=False)
    path = folder / "model.onnx"
    program.save(str(path))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    flat = [t for x in inputs for t in (x if isinstance(x, list | tuple) else [x])]
    names = [i.name for i in session.get_inputs()]
    assert len(names) == len(flat)
    return session.run(None, {n: t.numpy() for n, t in zip(names, flat, strict=True)})


def max_difference(module: nn.Module, inputs: tuple, folder: Path) -> float:
    (exported,) = run_onnx(module, inputs, folder)
    with torch.no_grad():
        expected = module(*inputs).numpy()
    assert exported.shape == expected.shape
    return float(np.abs(exported - expected).max())


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_a_hamburger_block_exports_and_runs_in_onnxruntime(version: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    ham = ih.NMF(rank=4, channels=16, eval_init="fixed")
    block = ih.Hamburger(24, ham, version, ham_channels=16).eval()
    x = torch.rand(2, 24, 9, 7)
    error = max_difference(block, (x,), tmp_path)
    print(f"ONNX Hamburger {version}: max |onnxruntime - torch| = {error:.2e}")
    assert error <= 1e-5


def test_the_light_ham_head_exports_and_runs_in_onnxruntime(tmp_path: Path) -> None:
    torch.manual_seed(0)
    head = ih.LightHamHead(
        [16, 24, 32],
        32,
        num_classes=5,
        in_index=[1, 2, 3],
        ham_channels=64,
        ham=segnext_nmf(64, eval_init="fixed"),
    ).eval()
    g = torch.Generator().manual_seed(1)
    levels = [torch.rand(1, c, s, s, generator=g) for c, s in ((8, 24), (16, 12), (24, 6), (32, 3))]
    error = max_difference(head, (levels,), tmp_path)
    print(f"ONNX LightHamHead: max |onnxruntime - torch| = {error:.2e}")
    assert error <= 1e-5


def test_random_bases_export_as_a_random_op_whose_draws_differ(tmp_path: Path) -> None:
    block = ih.Hamburger(16, ih.NMF(rank=4, channels=16), "v1").eval()
    assert max_difference(block, (torch.rand(2, 16, 8, 8),), tmp_path) > 1e-3


@pytest.mark.slow
def test_a_tolerance_solver_does_not_export(tmp_path: Path) -> None:
    solver = ih.FixedPointIteration(tol=1e-4)
    block = ih.Hamburger(16, ih.NMF(rank=4, channels=16, eval_init="fixed", solver=solver))
    with pytest.raises(Exception, match=r"torch\.export"):  # the stopping test reads values
        run_onnx(block.eval(), (torch.rand(2, 16, 8, 8),), tmp_path)


@pytest.mark.slow
def test_cd_does_not_convert_its_ridge_inverse(tmp_path: Path) -> None:
    block = ih.Hamburger(16, ih.CD(rank=4, channels=16, eval_init="fixed"), "v1").eval()
    with pytest.raises(Exception, match="linalg_inv_ex"):
        run_onnx(block, (torch.rand(2, 16, 8, 8),), tmp_path)
