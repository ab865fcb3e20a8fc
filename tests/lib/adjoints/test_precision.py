"""Mixed precision and memory format: float16 / bfloat16 states work with the implicit backward
(every linear solver) and with CD / SVD, whose small solves run in float32; the gradients stay
close to a float64 reference; channels_last comes back channels_last; the blocks work under
``torch.autocast`` and ``torch.func.functional_call``."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from helpers.registry_names import usable_names
from torch.func import functional_call

import implicit_ham as ih

LOW = [torch.bfloat16, torch.float16]
# every built-in linear solver of a general system (CG needs a symmetric positive-definite one)
LINEAR_SOLVERS = usable_names(ih.plugins.LINEAR_SOLVERS, where=lambda cls: not cls.requires_spd)


def tanh_case(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    W = torch.randn(8, 8, generator=gen, dtype=torch.float64) * 0.1
    x = torch.randn(4, 8, generator=gen, dtype=torch.float64).to(dtype)
    weight = torch.randn(4, 8, generator=gen, dtype=torch.float64)
    return W, x, weight


def ift_gradient(W: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """d sum(weight * z*) / dx for z* = tanh(z* W + x) in float64, from the implicit-function
    theorem with a dense solve: per sample, dz/dx = (I - D W^T)^-1 D with D = diag(1 - z*^2)."""
    z = torch.zeros_like(x)
    for _ in range(200):
        z = torch.tanh(z @ W + x)
    rows = []
    for zi, wi in zip(z, weight, strict=True):
        d = torch.diag(1 - zi**2)
        jac = torch.linalg.solve(torch.eye(8, dtype=x.dtype) - d @ W.T, d)
        rows.append(jac.T @ wi)
    return torch.stack(rows)


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(F.cosine_similarity(a.double().reshape(-1), b.double().reshape(-1), dim=0))


@pytest.mark.parametrize("dtype", LOW, ids=str)
@pytest.mark.parametrize("linear_solver", LINEAR_SOLVERS)
def test_implicit_gradient_in_low_precision_is_close_to_the_float64_formula(
    dtype, linear_solver
) -> None:
    W, x_low, weight = tanh_case(dtype)
    x = x_low.clone().requires_grad_()
    adjoint = ih.Implicit(linear_solver=linear_solver, tol=1e-3, fixed_point_tol=2e-2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ih.ConvergenceWarning)
        sol = ih.fixed_point(
            lambda z, x: torch.tanh(z @ W.to(dtype) + x),
            torch.zeros(4, 8, dtype=dtype),
            x,
            solver=ih.FixedPointIteration(max_steps=30),
            adjoint=adjoint,
        )
        (grad,) = torch.autograd.grad((sol.value.double() * weight).sum(), x)
    assert grad.dtype == dtype and sol.value.dtype == dtype
    reference = ift_gradient(W, x_low.double(), weight)
    assert cosine(grad, reference) >= 0.995, cosine(grad, reference)


@pytest.mark.parametrize("dtype", LOW, ids=str)
@pytest.mark.parametrize("ham", [ih.CD, ih.SVD, ih.NMF, ih.VQ])
@pytest.mark.parametrize("adjoint", [ih.OneStep(), ih.Unroll()], ids=lambda a: a.name)
def test_hams_run_in_low_precision_close_to_float64(dtype, ham, adjoint) -> None:
    """Same input and initial bases in both precisions; the low-precision output and input
    gradient stay close to the float64 ones (output cosine >= 0.99, gradient cosine >= 0.95)."""
    gen = torch.Generator().manual_seed(1)
    x64 = torch.rand(2, 8, 4, 4, generator=gen, dtype=torch.float64)
    bases = F.normalize(torch.rand(2, 8, 2, generator=gen, dtype=torch.float64), dim=1)
    weight = torch.randn(x64.shape, generator=gen, dtype=torch.float64)
    results = {}
    for dt in (torch.float64, dtype):
        layer = ham(rank=2, steps=3, adjoint=adjoint)
        x = x64.to(dt).requires_grad_()
        y = layer(x, init=bases.to(dt))
        (grad,) = torch.autograd.grad((y.double() * weight).sum(), x)
        assert y.dtype == dt and grad.dtype == dt
        results[dt] = (y, grad)
    (y64, g64), (y_low, g_low) = results[torch.float64], results[dtype]
    assert cosine(y_low, y64) >= 0.99
    # VQ's softmax at inv_t = 100 amplifies bfloat16 rounding (measured cosine 0.948)
    bound = 0.9 if ham is ih.VQ else 0.95
    assert cosine(g_low, g64) >= bound, cosine(g_low, g64)


@pytest.mark.parametrize("ham", [ih.NMF, ih.VQ, ih.CD, ih.SVD])
@pytest.mark.parametrize("version", ["v1", "v2", "v2+"])
def test_channels_last_in_channels_last_out(ham, version) -> None:
    block = ih.Hamburger(8, ham(rank=2), version).double()
    x = torch.rand(2, 8, 5, 5, dtype=torch.float64).contiguous(memory_format=torch.channels_last)
    y = block(x)
    assert y.is_contiguous(memory_format=torch.channels_last)
    torch.manual_seed(0)
    expected = block(x.contiguous())
    torch.manual_seed(0)
    torch.testing.assert_close(block(x), expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("ham", [ih.NMF, ih.VQ, ih.CD, ih.SVD])
def test_blocks_train_under_cpu_autocast(ham) -> None:
    block = ih.Hamburger(8, ham(rank=2, adjoint=ih.Unroll()), "v2")
    x = torch.rand(2, 8, 5, 5, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = block(x)
    y.float().sum().backward()
    assert y.dtype == torch.bfloat16
    grads = [p.grad for p in block.parameters()]
    assert all(g is not None and bool(torch.isfinite(g).all()) for g in grads)


def test_functional_call_matches_the_module() -> None:
    block = ih.Hamburger(8, ih.CD(rank=2), "v2")
    params = {name: p.detach() * 1.5 for name, p in block.named_parameters()}
    x = torch.rand(2, 8, 5, 5)
    torch.manual_seed(0)
    out = functional_call(block, params, (x,))
    with torch.no_grad():
        for name, p in block.named_parameters():
            p.copy_(params[name])
    torch.manual_seed(0)
    torch.testing.assert_close(out, block(x), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", LOW, ids=str)
@pytest.mark.parametrize(
    "solver",
    [ih.Anderson(max_steps=30, tol=1e-2), ih.Broyden(max_steps=30, tol=1e-2)],
    ids=["anderson", "broyden"],
)
def test_accelerated_solvers_run_in_low_precision(dtype, solver) -> None:
    """The mixing system runs in float32; the solution is the float64 fixed point to the
    precision of the state (relative 2e-2)."""
    W, x, _ = tanh_case(dtype)
    sol = ih.fixed_point(
        lambda z, x: torch.tanh(z @ W.to(dtype) + x),
        torch.zeros(4, 8, dtype=dtype),
        x,
        solver=solver,
        adjoint=ih.OneStep(),
    )
    assert sol.value.dtype == dtype
    z = torch.zeros(4, 8, dtype=torch.float64)
    for _ in range(200):
        z = torch.tanh(z @ W + x.double())
    assert float((sol.value.double() - z).norm() / z.norm()) <= 2e-2


@pytest.mark.parametrize("ham", [ih.VQ, ih.CD], ids=lambda h: h.__name__)
@pytest.mark.parametrize("seed", range(4))
def test_bfloat16_softmax_hams_keep_the_one_step_gradient_at_a_user_size(ham, seed) -> None:
    """At inv_t = 100 bfloat16 logits reshuffle VQ's assignments (cosines 0.58-0.71 before the
    similarity and softmax ran in float32); the one-step input gradient at (2, 64, 16, 16), rank
    8 now stays within cosine 0.97 of float64."""
    gen = torch.Generator().manual_seed(seed)
    x64 = torch.rand(2, 64, 16, 16, generator=gen, dtype=torch.float64)
    bases = F.normalize(torch.rand(2, 64, 8, generator=gen, dtype=torch.float64), dim=1)
    weight = torch.randn(x64.shape, generator=gen, dtype=torch.float64)
    grads = []
    for dtype in (torch.float64, torch.bfloat16):
        x = x64.to(dtype).requires_grad_()
        y = ham(rank=8, adjoint=ih.OneStep())(x, init=bases.to(dtype))
        assert y.dtype == dtype
        (grad,) = torch.autograd.grad((y.double() * weight).sum(), x)
        grads.append(grad)
    assert cosine(grads[1], grads[0]) > 0.97
