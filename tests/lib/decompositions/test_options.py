"""Decomposition's options (grouped dataclasses behind flat keywords) and the backward mode's
own say over the paper's one-step solve (issue 48 item 3)."""

from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path

import pytest
import torch

import implicit_ham as ih
from implicit_ham.decompositions.options import (
    BasesOptions,
    DecompositionOptions,
    IterationOptions,
    LayoutOptions,
)
from implicit_ham.plugins import parameter_names

DECOMPOSITIONS = Path(ih.__file__).parent / "decompositions"
ADJOINT_NAMES = ("Adjoint", "OneStep", "Unroll", "Truncated", "Phantom", "Implicit", "Neumann")


def test_no_isinstance_on_a_backward_mode_in_decompositions() -> None:
    """The backward mode says what it does (``readout_step_only``); a decomposition never asks
    which class it is."""
    pattern = re.compile(r"isinstance\([^)]*\b(" + "|".join(ADJOINT_NAMES) + r")\b")
    hits = [
        f"{path.name}:{number}: {line.strip()}"
        for path in sorted(DECOMPOSITIONS.glob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert not hits, hits


def test_init_takes_at_most_eight_parameters_and_the_flat_keywords_still_work() -> None:
    assert len(inspect.signature(ih.Decomposition.__init__).parameters) <= 8
    layer = ih.NMF(
        rank=4,
        steps=3,
        eval_steps=5,
        groups=2,
        channels=8,
        spatial=True,
        init="fixed",
        eval_init="fixed",
        init_seed=3,
        eta=0.5,
        online_update="train",
        eps=1e-5,
        norm_eps=1e-10,
        adjoint=ih.OneStep(),
    )
    assert layer.options == DecompositionOptions(
        inv_t=1.0,
        steps=3,
        eval_steps=5,
        eps=1e-5,
        norm_eps=1e-10,
        groups=2,
        channels=8,
        init="fixed",
        eval_init="fixed",
        init_seed=3,
        eta=0.5,
        online_update="train",
    )
    assert (layer.steps, layer.eval_steps, layer.groups, layer.channels) == (3, 5, 2, 8)
    assert (layer.init_mode, layer.eval_init_mode, layer.init_seed) == ("fixed", "fixed", 3)
    assert (layer.eta, layer.online_update, layer.eps, layer.norm_eps) == (
        0.5,
        "train",
        1e-5,
        1e-10,
    )
    assert ih.VQ(rank=4, inv_t=7.0).inv_t == 7.0 and ih.CD(rank=4).inv_t == 100.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        layer.options.steps = 4  # type: ignore[misc]
    layer.steps = 2  # the attributes stay settable between calls; options follows them
    assert layer.options.steps == 2
    assert ih.CD(rank=4, init="fixed").options.eval_init == "fixed"


def test_the_groups_partition_the_keywords_and_are_what_the_signature_readers_list() -> None:
    groups = [
        {f.name for f in dataclasses.fields(g)}
        for g in (IterationOptions, LayoutOptions, BasesOptions)
    ]
    union = {f.name for f in dataclasses.fields(DecompositionOptions)}
    assert sum(len(g) for g in groups) == len(union) and set().union(*groups) == union
    names = parameter_names(ih.CD)
    assert names[:2] == ["rank", "beta"]
    assert set(names) == union | {
        "rank",
        "beta",
        "solver",
        "adjoint",
        "grad_through_bases",
        "compile",
    }


def test_bad_options_name_the_layer_and_the_field() -> None:
    with pytest.raises(ValueError, match="VQ: eval_steps must be an integer >= 1"):
        ih.VQ(rank=4, eval_steps=0)
    with pytest.raises(ValueError, match="CD: eta must lie in"):
        ih.CD(rank=4, eta=2.0)
    with pytest.raises(ValueError, match="NMF: channels must be an integer >= 1"):
        ih.NMF(rank=4, channels=0)


class _DetachedReadout(ih.Truncated):
    """A plug-in mode that declares the one-step readout (without being ``OneStep``)."""

    @property
    def readout_step_only(self) -> bool:
        return True


@pytest.mark.parametrize("cls", [ih.NMF, ih.VQ, ih.CD])
def test_the_mode_decides_the_graph_free_solve(cls: type[ih.Decomposition]) -> None:
    """A mode that declares ``readout_step_only`` gets the paper's one-step gradient (bases
    detached: the gradient of the readout at the detached solution, computed here directly),
    one that does not (``Truncated(1)``) the last iteration's gradient through the bases."""
    assert ih.OneStep().readout_step_only and not ih.Truncated(1).readout_step_only
    x = torch.rand(2, 8, 4, 4, dtype=torch.float64)
    bases = torch.nn.functional.normalize(torch.rand(2, 8, 3, dtype=torch.float64), dim=1)
    grads = {}
    for name, adjoint in (("declared", _DetachedReadout(1)), ("truncated", ih.Truncated(1))):
        layer = cls(rank=3, steps=4, inv_t=2.0, adjoint=adjoint)
        xg = x.clone().requires_grad_()
        layer(xg, init=bases).square().sum().backward()
        grads[name] = xg.grad
    layer = cls(rank=3, steps=4, inv_t=2.0)
    with torch.no_grad():
        flat = layer.flatten(x)
        state = layer.implicit_problem(x, init=bases).z0
        for _ in range(4):
            state = layer.step(flat, state)
    xg = x.clone().requires_grad_()
    reference = layer.readout(layer.flatten(xg), tuple(t.detach() for t in state))
    reference.square().sum().backward()
    torch.testing.assert_close(grads["declared"], xg.grad, rtol=1e-12, atol=1e-12)
    assert not torch.allclose(grads["truncated"], xg.grad, rtol=1e-6, atol=1e-9)
