"""The optimised NMF, VQ and CD against their plain reference formulations (float64).

``implicit_ham.decompositions.reference`` writes each iteration literally from the equations
(left-to-right products, normalised copies of X, explicit inverse); the optimised layers reorder
products, reuse Gram matrices, hoist loop invariants and update temporaries in place. Both must
give the same outputs and input gradients under every gradient semantics, and the in-place
(no-grad) path must give bitwise the value of the out-of-place (grad) path.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import implicit_ham as ih
from implicit_ham.decompositions.reference import ReferenceCD, ReferenceNMF, ReferenceVQ

PAIRS = {"nmf": (ih.NMF, ReferenceNMF), "vq": (ih.VQ, ReferenceVQ), "cd": (ih.CD, ReferenceCD)}
MODES = {
    "paper_one_step": {"adjoint": ih.OneStep()},
    "grad_through_bases": {"adjoint": ih.OneStep(), "grad_through_bases": True},
    "unroll": {"adjoint": ih.Unroll()},
    "implicit_dense": {"adjoint": ih.Implicit(linear_solver="dense")},
}


def make_inputs(kind: str, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x (2, 8, 4, 5) (non-negative for NMF), initial bases (4, 4, 3) for groups=2, weights."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(2, 8, 4, 5, generator=gen, dtype=torch.float64) + 0.05
    if kind != "nmf":
        x = 2 * x - 1
    d0 = torch.rand(4, 4, 3, generator=gen, dtype=torch.float64)
    weight = torch.randn(x.shape, generator=gen, dtype=torch.float64)
    return x, d0 / d0.norm(dim=1, keepdim=True), weight


def output_and_grad(layer: ih.Decomposition, x: torch.Tensor, d0: torch.Tensor, weight):
    xg = x.clone().requires_grad_()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ih.ConvergenceWarning)
        y = layer(xg, init=d0)
        (y * weight).sum().backward()
    return y.detach(), xg.grad


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("kind", sorted(PAIRS))
def test_optimised_matches_reference_outputs_and_gradients(kind, mode):
    x, d0, weight = make_inputs(kind, seed=len(kind) + len(mode))
    fast_cls, plain_cls = PAIRS[kind]
    options = dict(rank=3, groups=2, steps=4, inv_t=None if kind == "nmf" else 5.0)
    y_fast, g_fast = output_and_grad(fast_cls(**options, **MODES[mode]), x, d0, weight)
    y_plain, g_plain = output_and_grad(plain_cls(**options, **MODES[mode]), x, d0, weight)
    assert g_plain.abs().max() > 1e-6
    torch.testing.assert_close(y_fast, y_plain, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(g_fast, g_plain, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("kind", sorted(PAIRS))
def test_channel_layout_matches_reference(kind):
    """spatial=False: X is a transposed (non-contiguous) view; same results."""
    gen = torch.Generator().manual_seed(11)
    x = torch.rand(1, 6, 3, 4, generator=gen, dtype=torch.float64) + 0.1
    d0 = torch.rand(1, 12, 2, generator=gen, dtype=torch.float64)
    d0 = d0 / d0.norm(dim=1, keepdim=True)
    weight = torch.randn(x.shape, generator=gen, dtype=torch.float64)
    fast_cls, plain_cls = PAIRS[kind]
    options = dict(rank=2, steps=3, spatial=False, adjoint=ih.Unroll())
    y_fast, g_fast = output_and_grad(fast_cls(**options), x, d0, weight)
    y_plain, g_plain = output_and_grad(plain_cls(**options), x, d0, weight)
    torch.testing.assert_close(y_fast, y_plain, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(g_fast, g_plain, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("kind", sorted(PAIRS))
def test_in_place_no_grad_path_is_bitwise_the_grad_path(kind):
    """The one-step solve runs under no_grad with in-place temporaries; Unroll runs the same
    iterations out of place with gradient. The states must be identical bit for bit."""
    x, d0, _ = make_inputs(kind, seed=3)
    layer = PAIRS[kind][0](rank=3, groups=2, steps=5)
    solver = layer.active_solver()
    with torch.no_grad():
        no_grad = layer.implicit_problem(x, init=d0).solve(solver, ih.OneStep())
    problem = layer.implicit_problem(x.clone().requires_grad_(), init=d0)
    with_grad = problem.solve(solver, ih.Unroll())
    assert with_grad.value[1].requires_grad
    for a, b in zip(no_grad.value, with_grad.value, strict=True):
        assert torch.equal(a, b.detach())


@pytest.mark.parametrize("kind", sorted(PAIRS))
def test_step_never_modifies_the_state_it_is_given(kind):
    x, d0, _ = make_inputs(kind, seed=4)
    layer = PAIRS[kind][0](rank=3, groups=2)
    flat = layer.flatten(x)
    state = layer.init(flat, d0)
    copies = tuple(t.clone() for t in state)
    with torch.no_grad():
        new = layer.step(flat, state)
    for before, after, fresh in zip(copies, state, new, strict=True):
        assert torch.equal(before, after)
        assert fresh.data_ptr() != after.data_ptr()


def test_reference_nmf_is_the_literal_equation():
    """One reference step equals the update written here: C <- C (X^T D) / (C D^T D + eps),
    D <- D (X C) / (D C^T C + eps) with the new C."""
    gen = torch.Generator().manual_seed(5)
    x = torch.rand(2, 5, 7, generator=gen, dtype=torch.float64)
    d = torch.rand(2, 5, 2, generator=gen, dtype=torch.float64)
    c = torch.rand(2, 7, 2, generator=gen, dtype=torch.float64)
    eps = 1e-6
    c_new = (
        c * torch.einsum("bdn,bdr->bnr", x, d) / (torch.einsum("bnr,bdr,bds->bns", c, d, d) + eps)
    )
    d_new = (
        d
        * torch.einsum("bdn,bnr->bdr", x, c_new)
        / (torch.einsum("bdr,bnr,bns->bds", d, c_new, c_new) + eps)
    )
    got_d, got_c = ReferenceNMF(rank=2).step(x, (d, c))
    torch.testing.assert_close(got_c, c_new, rtol=1e-12, atol=0)
    torch.testing.assert_close(got_d, d_new, rtol=1e-12, atol=0)
