"""ONNX export (``torch.onnx.export(..., dynamo=True)``) of a Hamburger block and of the
``LightHamHead`` in evaluation mode with a fixed number of iterations and ``eval_init="fixed"``:
onnxruntime's outputs equal PyTorch's within 1e-5 (NMF; VQ's sharp softmax within 5e-4). The
configurations docs/light_ham_head.md says do not export are checked to be refused, so the page
stays true."""

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


class Documented(nn.Module):
    """Every export path the docs show, in one module so that one export covers them: Hamburger
    v1 / v2 / v2+ around NMF and VQ built as the README and docs/decompositions.md build them
    (``channels`` not given: the block passes its width), one built by ``make_context``, and
    the ``LightHamHead`` of docs/light_ham_head.md. Two evaluation steps each (every step
    exports the same operations; fewer keep the export quick)."""

    def __init__(self) -> None:
        super().__init__()
        blocks = {}
        for name, make in (("nmf", ih.NMF), ("vq", ih.VQ)):
            for version in ("v1", "v2", "v2+"):
                ham = make(rank=4, eval_steps=2, eval_init="fixed", init_seed=len(blocks))
                blocks[f"{name}_{version}"] = ih.Hamburger(24, ham, version, ham_channels=16)
        blocks["context_nmf"] = ih.make_context("nmf", 24, rank=4, eval_steps=2, eval_init="fixed")
        for block in blocks.values():
            if block.version == "v2+":  # the ham's branch must count in the output
                nn.init.constant_(block.coef_ham, 0.5)
        self.blocks = nn.ModuleDict(blocks)
        self.head = ih.LightHamHead(
            [16, 24, 32],
            32,
            num_classes=5,
            in_index=[1, 2, 3],
            ham_channels=64,
            ham=segnext_nmf(64, eval_steps=2, eval_init="fixed"),
        )

    def forward(self, x: torch.Tensor, levels: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        return (*(block(x) for block in self.blocks.values()), self.head(levels))


def test_every_documented_export_path_matches_onnxruntime(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Documented().eval()
    for block in model.blocks.values():  # the block handed its width: a buffer, drawn once
        assert block.ham.fixed_bases.shape == (1, block.width, 4)
    g = torch.Generator().manual_seed(1)
    x = torch.rand(2, 24, 9, 7, generator=g)
    levels = [torch.rand(1, c, s, s, generator=g) for c, s in ((8, 24), (16, 12), (24, 6), (32, 3))]
    exported = run_onnx(model, (x, levels), tmp_path)
    with torch.no_grad():
        expected = model(x, levels)
    names = [*model.blocks, "head"]
    assert len(exported) == len(expected) == len(names)
    for name, got, want in zip(names, exported, expected, strict=True):
        error = float(np.abs(got - want.numpy()).max())
        scale = float(want.abs().max())
        print(f"ONNX {name}: max |onnxruntime - torch| = {error:.2e} (output scale {scale:.2f})")
        # VQ's softmax at inv_t = 100 amplifies float32 rounding (docs/light_ham_head.md)
        assert error <= (1e-4 if name.startswith("vq") else 1e-5), name


@pytest.mark.parametrize(
    ("ham", "match"),
    [
        (ih.NMF(rank=4), "'random' bases would export as a random-number node"),
        (ih.NMF(rank=4, channels=16, eval_init="online"), "'online' bases are updated in place"),
    ],
)
def test_an_export_that_would_not_be_faithful_is_refused(ham: ih.Decomposition, match: str) -> None:
    block = ih.Hamburger(16, ham, "v1").eval()
    with pytest.raises(Exception, match=match) as raised:
        torch.export.export(block, (torch.rand(2, 16, 8, 8),))
    assert "eval_init='fixed'" in str(raised.value)


def test_fixed_bases_drawn_at_each_forward_are_refused_naming_the_fix() -> None:
    lone = ih.NMF(rank=4, eval_init="fixed").eval()  # d unknown: drawn from the seed per call
    with pytest.raises(ih.errors.ExportError, match=r"build it with channels=C"):
        torch.export.export(lone, (torch.rand(2, 16, 8, 8),))
    x = torch.rand(2, 16, 8, 8)
    bases = lone.initial_bases(lone.flatten(x))
    exported = torch.export.export(lone, (x, bases)).module()  # explicit bases export
    assert torch.allclose(exported(x, bases), lone(x), atol=1e-6)
    dual = ih.Hamburger(
        16,
        ih.NMF(rank=4, eval_init="fixed"),
        "v2+",
        channel_ham=ih.NMF(rank=4, eval_init="fixed", spatial=False),
    ).eval()
    with pytest.raises(Exception, match=r"channel ham \(spatial=False\) cannot hold them"):
        torch.export.export(dual, (x,))


def test_the_onnx_exporter_surfaces_the_refusal(tmp_path: Path) -> None:
    block = ih.Hamburger(16, ih.NMF(rank=4, channels=16), "v1").eval()
    with pytest.raises(Exception, match="cannot be exported faithfully"):
        run_onnx(block, (torch.rand(2, 16, 8, 8),), tmp_path)


def test_a_block_hands_its_width_to_a_ham_built_without_channels() -> None:
    old = ih.Hamburger(32, ih.NMF(rank=4, channels=32), "v2").state_dict()  # no fixed buffer
    block = ih.Hamburger(32, ih.NMF(rank=4, eval_init="fixed", init_seed=5), "v2").eval()
    assert block.ham.channels == 32
    g = torch.Generator().manual_seed(5)
    seeded = torch.nn.functional.normalize(torch.rand(1, 32, 4, generator=g), dim=1)
    assert torch.equal(block.ham.fixed_bases, seeded)  # the seed's draw, as before: same values
    block.load_state_dict(old)  # a checkpoint without the buffer keeps the seeded bases
    assert torch.equal(block.ham.fixed_bases, seeded)


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
