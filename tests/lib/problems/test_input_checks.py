"""Inputs checked before the first call of f (``problems/input_checks.py``) and the hint the
note of an error inside f gives: a clear error naming the fix instead of a bare PyTorch error
from inside f."""

from __future__ import annotations

import sys

import pytest
import torch
from torch import nn

import implicit_ham as ih
from implicit_ham.problems.input_checks import modules_of


class Cell(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, z: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(0.5 * self.lin(z) + x)

    def step(self, z: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return self(z, x)


def test_a_float64_z0_into_a_float32_module_is_refused_before_f_runs() -> None:
    cell = Cell()
    x = torch.randn(3, 8)
    calls = []
    lin = cell.lin

    def closure(z: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        return torch.tanh(lin(z) + x)

    for f in (cell, cell.step, closure):  # the module, a bound method, a closure over one
        with pytest.raises(TypeError, match=r"z0 is torch.float64 but f's parameter") as info:
            ih.fixed_point(f, torch.zeros(3, 8, dtype=torch.float64), x)
        assert "torch.zeros(..., dtype=torch.float32)" in str(info.value)
        assert "module.to(torch.float64)" in str(info.value)
    assert not calls  # refused before the first call of f
    assert "Linear.weight" in str(info.value)
    # the right dtype runs; autocast casts the operands itself
    assert ih.fixed_point(cell, torch.zeros(3, 8), x).value.dtype == torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ih.fixed_point(cell, torch.zeros(3, 8, dtype=torch.bfloat16), x.bfloat16())


def test_modules_of_finds_what_f_computes_with() -> None:
    cell = Cell()
    assert list(modules_of(cell)) == [cell]
    assert list(modules_of(cell.step)) == [cell]
    lin = cell.lin
    assert list(modules_of(lambda z: lin(z))) == [lin]
    assert list(modules_of(lambda z: 2 * z)) == []


def test_a_z0_on_another_device_than_the_module_is_refused_naming_it() -> None:
    z0 = torch.zeros(3, 8, device="meta")  # a second device on any machine
    with pytest.raises(
        ValueError, match=r"z0 is on meta but f's parameter Cell.lin.weight is on cpu"
    ):
        ih.fixed_point(Cell(), z0, torch.randn(3, 8, device="meta"))


@pytest.mark.skipif(sys.version_info < (3, 11), reason="exception notes need Python 3.11")
def test_a_z0_of_another_batch_gets_a_hint_in_the_note() -> None:
    x = torch.randn(4, 8)
    with pytest.raises(RuntimeError, match="must match the size") as caught:
        ih.fixed_point(lambda z, x: torch.tanh(0.5 * z + x), torch.zeros(3, 8), x)
    (note,) = caught.value.__notes__
    assert "z0's batch is 3 but args[0] has 4 rows: if args[0] is batched, build z0 with 4" in note


def test_a_hamburger_names_the_wrong_channels_dtype_before_its_first_conv() -> None:
    block = ih.Hamburger(16, ih.NMF(rank=2), "v1")
    with pytest.raises(
        ValueError, match=r"expects \(B, 16, H, W\) maps or .*, got shape \(2, 8, 4, 4\)"
    ):
        block(torch.rand(2, 8, 4, 4))
    with pytest.raises(ValueError, match=r"\(B, 16, N\) sequences, got shape \(2, 4, 9\)"):
        block(torch.rand(2, 4, 9))  # a sequence of the wrong width
    with pytest.raises(TypeError, match=r"input is torch.float64 but the module's parameters are"):
        block(torch.rand(2, 16, 4, 4, dtype=torch.float64))
    assert block.double()(torch.rand(2, 16, 4, 4, dtype=torch.float64)).dtype == torch.float64
    with pytest.raises(ValueError, match="the input is on meta but the module's parameters are on"):
        block.float()(torch.rand(2, 16, 4, 4, device="meta"))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert block.float()(torch.rand(2, 16, 4, 4, dtype=torch.bfloat16)).shape == (2, 16, 4, 4)
