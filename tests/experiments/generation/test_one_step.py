"""HamGAN's one-step gradient is the library's ``NMF(adjoint=OneStep())`` (grad_through_bases
False): after the K multiplicative updates both bases and coefficients are constants
(``tf.stop_gradient`` in the official ``gan/HamGAN/ham.py``), then one coefficient update runs
with gradient and the output is ``C' D^T`` with the constant bases.

References, in float64: an independent re-implementation of that recipe, and the closed form
of its gradient, ``dL/dX = D (C / den * (G^T D))^T`` (``G = dL/dY``, ``den = C D^T D + eps``).
BPTT (``Unroll``) must give a different gradient (so the comparison can fail).
"""

from __future__ import annotations

import torch

import implicit_ham as ih

EPS = 1e-6


def hamgan_one_step(x: torch.Tensor, bases: torch.Tensor, steps: int) -> torch.Tensor:
    """HamGAN's NMF (B, d, n) -> (B, d, n) from initial bases (B, d, r), written from the paper's
    update rules: K updates without gradient, then one coefficient update with gradient."""
    with torch.no_grad():
        d = bases.clone()
        c = torch.softmax(x.transpose(1, 2) @ d, dim=-1)
        for _ in range(steps):
            c = c * (x.transpose(1, 2) @ d) / (c @ (d.transpose(1, 2) @ d) + EPS)
            d = d * (x @ c) / (d @ (c.transpose(1, 2) @ c) + EPS)
    c = c * (x.transpose(1, 2) @ d) / (c @ (d.transpose(1, 2) @ d) + EPS)
    return d @ c.transpose(1, 2)


def _problem(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(2, 12, 30, generator=g, dtype=torch.float64)
    bases = torch.nn.functional.normalize(
        torch.rand(2, 12, 4, generator=g, dtype=torch.float64), dim=1
    )
    cotangent = torch.randn(2, 12, 30, generator=g, dtype=torch.float64)
    return x, bases, cotangent


def _library_vjp(
    adjoint: ih.plugins.Adjoint, x: torch.Tensor, bases: torch.Tensor, v: torch.Tensor
):
    layer = ih.NMF(rank=4, steps=5, eval_steps=5, adjoint=adjoint)
    x4 = x.reshape(2, 12, 5, 6).clone().requires_grad_(True)
    y = layer(x4, init=bases)
    (grad,) = torch.autograd.grad(y, x4, v.reshape(2, 12, 5, 6))
    return y.detach().reshape(2, 12, 30), grad.reshape(2, 12, 30)


def test_library_one_step_equals_the_hamgan_recipe_value_and_gradient() -> None:
    x, bases, v = _problem()
    y_lib, g_lib = _library_vjp(ih.OneStep(), x, bases, v)
    xr = x.clone().requires_grad_(True)
    y_ref = hamgan_one_step(xr, bases, steps=5)
    (g_ref,) = torch.autograd.grad(y_ref, xr, v)
    torch.testing.assert_close(y_lib, y_ref.detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(g_lib, g_ref, rtol=1e-10, atol=1e-12)


def test_one_step_gradient_matches_its_closed_form() -> None:
    """Only the last coefficient update carries gradient: with D, C the K-step state,
    dL/dX = D (C / den * (G^T D))^T, nothing through D or C."""
    x, bases, v = _problem(1)
    _, g_lib = _library_vjp(ih.OneStep(), x, bases, v)
    d = bases.clone()
    c = torch.softmax(x.transpose(1, 2) @ d, dim=-1)
    for _ in range(5):
        c = c * (x.transpose(1, 2) @ d) / (c @ (d.transpose(1, 2) @ d) + EPS)
        d = d * (x @ c) / (d @ (c.transpose(1, 2) @ c) + EPS)
    den = c @ (d.transpose(1, 2) @ d) + EPS
    closed = d @ ((c / den) * (v.transpose(1, 2) @ d)).transpose(1, 2)
    torch.testing.assert_close(g_lib, closed, rtol=1e-10, atol=1e-12)


def test_bptt_differs_from_one_step_and_reaches_x_through_the_bases() -> None:
    x, bases, v = _problem(2)
    y_one, g_one = _library_vjp(ih.OneStep(), x, bases, v)
    y_bptt, g_bptt = _library_vjp(ih.Unroll(), x, bases, v)
    torch.testing.assert_close(y_one, y_bptt, rtol=1e-12, atol=1e-12)  # same forward value
    relative = (g_bptt - g_one).norm() / g_one.norm()
    assert relative > 0.05, f"BPTT and one-step gradients nearly equal ({relative:.2e})"
