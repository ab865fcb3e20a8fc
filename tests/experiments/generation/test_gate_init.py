"""The context gate's initial gamma: 0 leaves the network exactly the no-context one, and its
context parameters get no gradient (why the discriminator's gate starts open in the jobs)."""

from __future__ import annotations

import math

import pytest
import torch

from experiments.generation.job import GanJob, build_networks
from experiments.generation.nets import LocalDiscriminator
from experiments.models.gan import ZeroGate
from implicit_ham.nn.context import make_context


def test_gate_value_is_the_interpolation_it_documents() -> None:
    torch.manual_seed(0)
    context = torch.nn.Conv2d(3, 3, 1)
    z = torch.randn(2, 3, 4, 4)
    for init in (0.0, 0.25, 1.0):
        gate = ZeroGate(context, init=init)
        assert float(gate.gamma) == init
        expected = (1 - init) * z + init * context(z)
        torch.testing.assert_close(gate(z), expected)


def test_closed_gate_gives_the_context_no_gradient_and_an_open_one_does() -> None:
    torch.manual_seed(0)
    x = torch.rand(4, 1, 32, 32) * 2 - 1
    grads = {}
    for init in (0.0, 1.0):
        torch.manual_seed(1)
        d = LocalDiscriminator(make_context("self_attention", 16), width=16, gate_init=init)
        d(x).mean().backward()
        inner = [p.grad for n, p in d.named_parameters() if n.startswith("context.context.")]
        grads[init] = max(float(g.abs().max()) for g in inner if g is not None)
    assert grads[0.0] == 0.0
    assert grads[1.0] > 1e-6


def test_jobs_open_the_discriminators_gate_only() -> None:
    g, d = build_networks(GanJob(arm="self_attention", seed=0, g_width=16, d_width=16))
    assert float(g.context.gamma) == 0.0
    assert float(d.context.gamma) == GanJob(arm="none", seed=0).d_gate_init == 1.0


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_non_finite_init_is_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="init must be finite"):
        ZeroGate(torch.nn.Identity(), init=bad)
