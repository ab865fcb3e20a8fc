"""The optional torch.compile path (``compile=True``) matches eager mode (float64, tiny size).

torch.compile on the CPU generates and builds C++ (gcc): a cold compile of the two kernels
(the no-grad step and the readout with gradient) takes about 10-30 s on 2 cores, a warm one
(the inductor cache under /tmp) a few seconds, hence ``slow``.
"""

from __future__ import annotations

import copy
import logging
import pickle
import time

import pytest
import torch

import implicit_ham as ih

logger = logging.getLogger(__name__)


def test_compile_flag_is_exposed_through_make_context_and_printed():
    block = ih.make_context("nmf", 8, rank=2, compile=True)
    assert block.ham.use_compile and "compile=True" in repr(block.ham)
    assert not ih.make_context("nmf", 8, rank=2).ham.use_compile


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_compiled_nmf_matches_eager_forward_and_gradient():
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(2, 8, 4, 4, generator=gen, dtype=torch.float64) + 0.1
    d0 = torch.rand(2, 8, 3, generator=gen, dtype=torch.float64)
    d0 = d0 / d0.norm(dim=1, keepdim=True)
    weight = torch.randn(x.shape, generator=gen, dtype=torch.float64)
    results = {}
    for compiled in (False, True):
        layer = ih.NMF(rank=3, steps=4, compile=compiled)
        xg = x.clone().requires_grad_()
        start = time.perf_counter()
        y = layer(xg, init=d0)
        (y * weight).sum().backward()
        results[compiled] = (y.detach(), xg.grad, time.perf_counter() - start)
        for clone in (copy.deepcopy(layer), pickle.loads(pickle.dumps(layer))):
            assert torch.equal(clone(x, init=d0), y.detach())  # copies run (compiled again)
    logger.info("compile + first training step: %.1f s", results[True][2])
    y_eager, g_eager, _ = results[False]
    y_comp, g_comp, _ = results[True]
    assert g_eager.abs().max() > 1e-3
    torch.testing.assert_close(y_comp, y_eager, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(g_comp, g_eager, rtol=1e-12, atol=1e-14)
