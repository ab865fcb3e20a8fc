"""The decomposition layer's API: registry, init policies, bad inputs, the plug-in example."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

import implicit_ham as ih

# ---------------------------------------------------------------- README plug-in example


@ih.register_decomposition("als")
class ALS(ih.Decomposition):
    """Alternating least squares with a ridge term lam: X ~ D C^T.

    C <- X^T D (D^T D + lam I)^-1,   D <- X C (C^T C + lam I)^-1
    """

    def __init__(self, rank: int = 64, *, lam: float = 0.1, **kwargs):
        super().__init__(rank, **kwargs)
        self.lam = lam

    def ridge(self, a: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
        """a f (f^T f + lam I)^-1 for a (B, p, q), f (B, q, r) -> (B, p, r)."""
        eye = torch.eye(f.shape[-1], dtype=f.dtype, device=f.device)
        return torch.linalg.solve(f.mT @ f + self.lam * eye, (a @ f).mT).mT

    def step(self, x, state):
        bases, _ = state
        coef = self.ridge(x.mT, bases)  # (B*S, n, r)
        return self.ridge(x, coef), coef  # bases (B*S, d, r), coefficients

    def compute_coef(self, x, state):
        return self.ridge(x.mT, state[0])


def test_plugin_example_works_with_every_backward_mode_and_in_a_block():
    x = torch.randn(2, 16, 12, 12)
    ham = ih.make_decomposition("als", rank=4, lam=0.1)
    assert ham(x).shape == x.shape
    for adjoint in (ih.Unroll(), ih.Truncated(2), ih.Phantom(2, 0.5), ih.Neumann(3, 0.5)):
        ham.adjoint = adjoint
        xg = x.clone().requires_grad_()
        ham(xg).square().sum().backward()
        assert torch.isfinite(xg.grad).all() and xg.grad.abs().max() > 0
    block = ih.make_context("als", channels=16, rank=4, lam=0.1, version="v2")
    assert isinstance(block, ih.Hamburger) and block(x).shape == x.shape
    assert "als" in ih.plugins.context_names()


def test_plugin_example_converges_to_the_best_rank_r_approximation():
    """With lam -> 0, ALS's fixed point is the truncated SVD (Eckart-Young)."""
    gen = torch.Generator().manual_seed(0)
    u, _ = torch.linalg.qr(torch.randn(6, 6, generator=gen, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(10, 10, generator=gen, dtype=torch.float64))
    s = torch.zeros(6, 10, dtype=torch.float64)
    s[range(6), range(6)] = torch.tensor([5.0, 3.0, 0.6, 0.4, 0.2, 0.1], dtype=torch.float64)
    x = u @ s @ v.T
    ham = ih.make_decomposition("als", rank=2, lam=1e-12, steps=40)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y = ham(x.reshape(1, 6, 2, 5)).reshape(6, 10)
    best = u[:, :2] @ s[:2, :2] @ v[:, :2].T
    assert (y - best).abs().max().item() < 1e-9


# --------------------------------------------------------------------------- registry


def test_registry_lists_builtins_and_builds_with_options():
    assert {"nmf", "vq", "cd", "svd"} <= set(ih.plugins.DECOMPOSITIONS.names())
    cd = ih.make_decomposition("cd", rank=3, beta=0.5, groups=2, adjoint="unroll")
    assert isinstance(cd, ih.CD) and cd.beta == 0.5 and cd.groups == 2
    assert isinstance(cd.adjoint, ih.Unroll)
    assert (ih.NMF().inv_t, ih.VQ().inv_t, ih.CD().inv_t) == (1.0, 100.0, 100.0)


def test_registry_errors_list_the_choices():
    with pytest.raises(KeyError, match=r"unknown decomposition 'nfm'.*cd.*nmf.*svd.*vq"):
        ih.make_decomposition("nfm")
    with pytest.raises(TypeError, match=r"unknown option\(s\) rnak .*valid options: rank"):
        ih.make_decomposition("nmf", rnak=3)
    with pytest.raises(TypeError, match="beta"):
        ih.make_decomposition("nmf", beta=0.1)
    with pytest.raises(TypeError, match="Decomposition subclasses"):
        ih.register_decomposition("not_a_layer")(torch.nn.Identity)
    with pytest.raises(ValueError, match="already registered"):
        ih.register_decomposition("nmf")(ih.CD)


def test_constructor_validates_arguments():
    with pytest.raises(ValueError, match="rank must be an integer >= 1"):
        ih.NMF(rank=0)
    with pytest.raises(ValueError, match="init must be one of random, online"):
        ih.NMF(init="zeros")
    with pytest.raises(ValueError, match="beta must be a positive number"):
        ih.CD(beta=0.0)
    with pytest.raises(ValueError, match="not divisible by groups=3"):
        ih.VQ(rank=2, groups=3, channels=16)


# ------------------------------------------------------------------------- bad inputs


def test_nmf_rejects_negative_input():
    with pytest.raises(ValueError, match=r"non-negative input.*ReLU"):
        ih.NMF(rank=2)(torch.randn(1, 8, 4, 4))
    with pytest.raises(ValueError, match="non-negative initial bases"):
        ih.NMF(rank=2)(torch.rand(1, 8, 4, 4), init=-torch.rand(1, 8, 2))


def test_channels_not_divisible_by_groups():
    with pytest.raises(ValueError, match="channels=10 is not divisible by groups=4"):
        ih.CD(rank=2, groups=4)(torch.randn(1, 10, 4, 4))


def test_rank_too_large_for_the_input():
    with pytest.raises(ValueError, match=r"rank=8 must be smaller than min\(d, n\) = min\(8, 16\)"):
        ih.VQ(rank=8)(torch.randn(1, 8, 4, 4))
    with pytest.raises(ValueError, match=r"min\(4, 8\).*channel"):
        ih.CD(rank=4, spatial=False)(torch.randn(1, 8, 2, 2))


def test_explicit_init_of_the_wrong_shape():
    with pytest.raises(ValueError, match=r"shape \(B\*S, d, r\) = \(4, 4, 2\).*got \(2, 8, 2\)"):
        ih.CD(rank=2, groups=2)(torch.randn(2, 8, 4, 4), init=torch.randn(2, 8, 2))


def test_non_finite_input():
    x = torch.rand(1, 8, 4, 4)
    x[0, 3, 1, 1] = float("nan")
    with pytest.raises(ih.NonFiniteError, match="NaN or infinity"):
        ih.NMF(rank=2)(x)
    x[0, 3, 1, 1] = float("inf")
    with pytest.raises(ih.NonFiniteError, match="NaN or infinity"):
        ih.CD(rank=2)(x)


def test_wrong_number_of_dimensions_and_channels():
    with pytest.raises(ValueError, match=r"\(B, C, H, W\)"):
        ih.CD(rank=2)(torch.randn(8, 16))
    with pytest.raises(ValueError, match="built for channels=8"):
        ih.CD(rank=2, channels=8)(torch.randn(1, 16, 4, 4))


# ---------------------------------------------------------------------- init policies


def test_random_init_follows_the_global_rng_and_explicit_init_is_reproducible():
    x = torch.rand(2, 8, 4, 4)
    nmf = ih.NMF(rank=3)
    torch.manual_seed(11)
    a = nmf(x)
    torch.manual_seed(11)
    b = nmf(x)
    c = nmf(x)
    assert torch.equal(a, b) and not torch.equal(a, c)
    d0 = F.normalize(torch.rand(2, 8, 3), dim=1)
    assert torch.equal(nmf(x, init=d0), nmf(x, init=d0))


def test_random_bases_distribution_and_normalisation():
    x = torch.randn(3, 16, 8, 8)
    torch.manual_seed(0)
    nmf_bases = ih.NMF(rank=4).initial_bases(ih.NMF(rank=4).flatten(x.abs()))
    cd_bases = ih.CD(rank=4).initial_bases(ih.CD(rank=4).flatten(x))
    for bases in (nmf_bases, cd_bases):
        assert bases.shape == (3, 16, 4)
        assert torch.allclose(bases.norm(dim=1), torch.ones(3, 4), atol=1e-6)
    assert bool((nmf_bases >= 0).all()) and bool((cd_bases < 0).any())


def test_online_bases_follow_the_official_update_in_eval_mode_only():
    torch.manual_seed(0)
    vq = ih.VQ(rank=3, groups=2, channels=8, init="online", inv_t=5.0)
    assert vq.bases.shape == (2, 4, 3) and "bases" in vq.state_dict()
    before = vq.bases.clone()
    x = torch.randn(3, 8, 4, 4, requires_grad=True)
    vq(x).sum().backward()
    assert torch.equal(vq.bases, before)  # training mode: the official code leaves them
    vq.eval()
    y = vq(x)
    final = vq.last_solution.value[0].reshape(3, 2, 4, 3).mean(dim=0)
    moved = before + 0.9 * (final - before)
    assert torch.allclose(vq.bases, moved / moved.norm(dim=1, keepdim=True), atol=1e-6)
    y.sum().backward()  # the in-place buffer update does not disturb autograd
    trained = ih.VQ(rank=3, groups=2, channels=8, init="online", online_update="train")
    start = trained.bases.clone()
    trained(x)
    assert not torch.equal(trained.bases, start)
    with pytest.raises(ValueError, match="needs channels=C and spatial=True"):
        ih.VQ(rank=3, init="online")
    with pytest.raises(ValueError, match="needs channels=C and spatial=True"):
        ih.VQ(rank=3, init="online", channels=8, spatial=False)


def test_any_spatial_size_and_readable_repr():
    cd = ih.CD(rank=3, groups=2)
    for shape in ((2, 8, 16, 16), (1, 8, 48, 40), (3, 8, 3, 5)):
        assert cd(torch.randn(shape)).shape == shape
    text = repr(ih.CD(rank=3, beta=0.2, adjoint=ih.Implicit()))
    assert text.startswith("CD(rank=3") and "beta=0.2" in text and "Implicit(" in text
    assert "solver=" not in repr(ih.NMF()) and "Anderson(" in repr(ih.NMF(solver="anderson"))


class StepOnly(ih.Decomposition):
    """A plug-in that defines only ``step`` (one subspace-iteration step)."""

    def step(self, x, state):
        coef = x.mT @ state[0]
        return torch.nn.functional.normalize(x @ coef, dim=1), coef


def test_a_plugin_defining_only_step_stays_differentiable_under_the_default_mode():
    """Default one-step gradient: the readout is D_K (detached) times the C of one more step,
    C = X^T D_K, so y = D_K D_K^T X and d sum(W * y) / dX = D_K D_K^T W, written out here."""
    layer = StepOnly(rank=2, steps=3).double()
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 6, 3, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(x.shape, generator=gen, dtype=torch.float64)
    y = layer(x)
    assert y.requires_grad
    (grad,) = torch.autograd.grad((y * weight).sum(), x)
    bases = layer.last_solution.value[0]  # (B, d, r) after the K steps
    expected = (bases @ bases.mT @ weight.reshape(2, 6, 9)).reshape(x.shape)
    torch.testing.assert_close(grad, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("layer", [ih.NMF, ih.VQ, ih.CD])
def test_integer_input_is_refused_by_name(layer: type) -> None:
    """Issue 47 item 10: an integer feature map failed inside torch (NotImplementedError:
    "normal_kernel_cpu" not implemented for 'Long'); now a TypeError naming the dtype and the
    fix."""
    x = torch.randint(0, 5, (2, 8, 4, 4))
    with pytest.raises(TypeError, match=r"x must be a floating-point tensor, got torch\.int64"):
        layer(rank=2)(x)
