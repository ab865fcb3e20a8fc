"""Parity of NMF, VQ and CD with a float64 re-implementation written here from docs/hamburger.md §2.

For fixed initial bases, the layer's output and its input gradient must match the reference to
1e-8 under the paper's one-step gradient, under ``grad_through_bases=True`` (the last iteration
carries gradient) and under ``Unroll`` (every iteration carries gradient).
"""

from __future__ import annotations

import zlib

import pytest
import torch

import implicit_ham as ih

EPS = 1e-6
K = 3


def softmax_r(a: torch.Tensor) -> torch.Tensor:
    e = torch.exp(a - a.max(dim=-1, keepdim=True).values)
    return e / e.sum(dim=-1, keepdim=True)


def unit_d(v: torch.Tensor) -> torch.Tensor:
    """v / max(||v||_d, eps), columns over dim 1."""
    return v / v.norm(dim=1, keepdim=True).clamp(min=EPS)


def nmf_step(X, D, C):
    C = C * (X.mT @ D) / (C @ (D.mT @ D) + EPS)
    D = D * (X @ C) / (D @ (C.mT @ C) + EPS)
    return D, C


def nmf_coef(X, D, C):
    return C * (X.mT @ D) / (C @ (D.mT @ D) + EPS)


def vq_step(X, D, C, inv_t):
    C = softmax_r(inv_t * unit_d(X).mT @ unit_d(D))
    C = C / (C.sum(dim=1, keepdim=True) + EPS)
    return X @ C, C


def vq_coef(X, D, C, inv_t):
    Xn = X / (X.detach().norm(dim=1, keepdim=True) + EPS)
    return softmax_r(inv_t * Xn.mT @ unit_d(D))


def cd_step(X, D, C, inv_t):
    C = softmax_r(inv_t * unit_d(X).mT @ D)
    C = C / (C.sum(dim=1, keepdim=True) + EPS)
    return unit_d(X @ C), C


def cd_coef(X, D, C, beta):
    r = D.shape[-1]
    return X.mT @ D @ torch.linalg.inv(D.mT @ D + beta * torch.eye(r, dtype=D.dtype))


def reference(kind: str, X: torch.Tensor, D0: torch.Tensor, mode: str) -> torch.Tensor:
    """Low-rank output (B*S, d, n). mode: "paper" (K steps and C0 without gradient, final
    coefficients with gradient, detached bases), "last" (the last step and the readout with
    gradient), "unroll" (everything with gradient)."""
    inv_t = {"nmf": 1.0, "vq": 100.0, "cd": 100.0}[kind]
    step = {
        "nmf": nmf_step,
        "vq": lambda X, D, C: vq_step(X, D, C, inv_t),
        "cd": lambda X, D, C: cd_step(X, D, C, inv_t),
    }[kind]
    coef = {
        "nmf": nmf_coef,
        "vq": lambda X, D, C: vq_coef(X, D, C, inv_t),
        "cd": lambda X, D, C: cd_coef(X, D, C, 0.1),
    }[kind]
    Xs = X if mode == "unroll" else X.detach()
    D, C = D0, softmax_r(inv_t * Xs.mT @ D0)
    for k in range(K):
        Xk = X if (mode == "unroll" or (mode == "last" and k == K - 1)) else X.detach()
        D, C = step(Xk, D, C)
    return D @ coef(X, D, C).mT


def layout(x: torch.Tensor, groups: int, spatial: bool) -> torch.Tensor:
    b, c, h, w = x.shape
    g = x.reshape(b * groups, c // groups, h * w)
    return g if spatial else g.transpose(1, 2)


def unlayout(y: torch.Tensor, shape: torch.Size, spatial: bool) -> torch.Tensor:
    return (y if spatial else y.transpose(1, 2)).reshape(shape)


def make_inputs(kind: str, spatial: bool, seed: int):
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(2, 8, 4, 5, generator=gen, dtype=torch.float64) + 0.05
    if kind != "nmf":
        x = x - 0.5
    groups = 2
    d = 4 if spatial else 20
    if kind == "nmf":
        d0 = torch.rand(4, d, 3, generator=gen, dtype=torch.float64)
    else:
        d0 = torch.randn(4, d, 3, generator=gen, dtype=torch.float64)
    d0 = d0 / d0.norm(dim=1, keepdim=True)
    weight = torch.randn(x.shape, generator=gen, dtype=torch.float64)
    return x, d0, weight, groups


LAYERS = {"nmf": ih.NMF, "vq": ih.VQ, "cd": ih.CD}
MODES = {
    "paper": {"adjoint": ih.OneStep()},
    "last": {"adjoint": ih.OneStep(), "grad_through_bases": True},
    "unroll": {"adjoint": ih.Unroll()},
}


@pytest.mark.parametrize("spatial", [True, False])
@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("kind", sorted(LAYERS))
def test_forward_and_input_gradient_match_float64_reference(kind, mode, spatial):
    x, d0, weight, groups = make_inputs(
        kind, spatial, seed=zlib.crc32(f"{kind}-{mode}-{spatial}".encode())
    )
    layer = LAYERS[kind](rank=3, groups=groups, steps=K, spatial=spatial, **MODES[mode])

    x_layer = x.clone().requires_grad_()
    y = layer(x_layer, init=d0)
    (y * weight).sum().backward()

    x_ref = x.clone().requires_grad_()
    y_ref = unlayout(reference(kind, layout(x_ref, groups, spatial), d0, mode), x.shape, spatial)
    (y_ref * weight).sum().backward()

    assert y.dtype == torch.float64
    assert (y - y_ref).abs().max().item() <= 1e-8
    assert x_ref.grad.abs().max().item() > 0
    assert (x_layer.grad - x_ref.grad).abs().max().item() <= 1e-8


@pytest.mark.parametrize("kind", sorted(LAYERS))
def test_the_three_gradients_differ(kind):
    """The three gradient semantics are genuinely different (so the parity test above
    distinguishes them)."""
    x, d0, weight, groups = make_inputs(kind, True, seed=7)
    grads = []
    for mode in sorted(MODES):
        layer = LAYERS[kind](rank=3, groups=groups, steps=K, **MODES[mode])
        xg = x.clone().requires_grad_()
        (layer(xg, init=d0) * weight).sum().backward()
        grads.append(xg.grad)
    for i in range(len(grads)):
        for j in range(i + 1, len(grads)):
            assert (grads[i] - grads[j]).abs().max().item() > 1e-6


def test_eval_mode_uses_eval_steps():
    x, d0, _, groups = make_inputs("cd", True, seed=3)
    layer = ih.CD(rank=3, groups=groups, steps=K, eval_steps=K + 2)
    layer.eval()
    layer(x, init=d0)
    assert layer.last_solution.stats.steps == K + 2
    layer.train()
    layer(x, init=d0)
    assert layer.last_solution.stats.steps == K
