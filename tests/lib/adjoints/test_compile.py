"""torch.compile of whole blocks and of ``fixed_point``: zero graph breaks
(``torch._dynamo.explain``) for NMF / VQ / CD under OneStep, Unroll and Phantom in training and
evaluation mode, and compiled outputs and gradients equal to eager mode (the ``aot_eager``
backend traces forward and backward exactly as inductor does, without building C++; one
inductor run is in ``test_perf_compile.py``)."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch._dynamo as dynamo

import implicit_ham as ih

HAMS = [ih.NMF, ih.VQ, ih.CD]
MODES = [ih.OneStep(), ih.Unroll(), ih.Phantom(2, 0.5)]


@pytest.fixture(autouse=True)
def fresh_dynamo():
    dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ih.ConvergenceWarning)
        yield
    dynamo.reset()


def block(ham, adjoint, training: bool) -> ih.Hamburger:
    torch.manual_seed(0)
    return ih.Hamburger(16, ham(rank=4, adjoint=adjoint), "v2").double().train(training)


@pytest.mark.parametrize("ham", HAMS)
@pytest.mark.parametrize("adjoint", MODES, ids=lambda a: a.name)
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_a_block_compiles_without_graph_breaks(ham, adjoint, training) -> None:
    explanation = dynamo.explain(block(ham, adjoint, training))(
        torch.rand(2, 16, 6, 6, dtype=torch.float64)
    )
    assert explanation.graph_break_count == 0, explanation.break_reasons


def test_fixed_point_with_a_fixed_budget_compiles_without_graph_breaks() -> None:
    W = torch.randn(8, 8) * 0.1

    def layer(x: torch.Tensor) -> torch.Tensor:
        return ih.fixed_point(
            lambda z, x: torch.tanh(z @ W + x), torch.zeros_like(x), x,
            solver=ih.FixedPointIteration(max_steps=6), adjoint=ih.OneStep(),
        ).value  # fmt: skip

    explanation = dynamo.explain(layer)(torch.randn(4, 8))
    assert explanation.graph_break_count == 0, explanation.break_reasons


@pytest.mark.parametrize("ham", HAMS)
@pytest.mark.parametrize("adjoint", [ih.OneStep(), ih.Unroll()], ids=lambda a: a.name)
def test_compiled_block_equals_eager_in_value_and_gradient(ham, adjoint) -> None:
    eager = block(ham, adjoint, True)
    compiled_module = block(ham, adjoint, True)
    compiled = torch.compile(compiled_module, backend="aot_eager", fullgraph=True)
    gen = torch.Generator().manual_seed(1)
    x = torch.rand(2, 16, 6, 6, generator=gen, dtype=torch.float64)
    weight = torch.randn(x.shape, generator=gen, dtype=torch.float64)
    outputs = []
    for module, params in ((eager, eager), (compiled, compiled_module)):
        xg = x.clone().requires_grad_()
        torch.manual_seed(2)
        y = module(xg)
        grads = torch.autograd.grad((y * weight).sum(), [xg, *params.parameters()])
        outputs.append((y.detach(), grads))
    (y_e, g_e), (y_c, g_c) = outputs
    torch.testing.assert_close(y_c, y_e, rtol=1e-10, atol=1e-12)
    for a, b in zip(g_c, g_e, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_make_context_takes_a_compile_key_for_the_whole_block() -> None:
    block = ih.make_context("cd", 8, rank=2, compile_block=True)
    plain = ih.make_context("cd", 8, rank=2)
    assert block._compiled_call_impl is not None and plain._compiled_call_impl is None
    assert block.state_dict().keys() == plain.state_dict().keys()


AT_POINT = [
    ih.Implicit(linear_solver="dense", fixed_point_tol=None),
    ih.Neumann(5, 0.5, fixed_point_tol=None),
]


def tanh_layer(adjoint: ih.plugins.Adjoint, W: torch.Tensor):
    def layer(x: torch.Tensor) -> torch.Tensor:
        return ih.fixed_point(
            lambda z, x: torch.tanh(z @ W + x), torch.zeros_like(x), x,
            solver=ih.FixedPointIteration(max_steps=8), adjoint=adjoint,
        ).value  # fmt: skip

    return layer


@pytest.mark.slow
@pytest.mark.parametrize("adjoint", AT_POINT, ids=lambda a: a.name)
def test_at_point_modes_with_a_solve_free_of_host_checks_compile_whole(adjoint) -> None:
    """Implicit(dense) and Neumann without a fixed-point tolerance: zero graph breaks, and
    compiled gradients equal to eager mode."""
    W = torch.nn.Parameter(torch.randn(8, 8, dtype=torch.float64) * 0.1)
    layer = tanh_layer(adjoint, W)
    x = torch.randn(4, 8, dtype=torch.float64)
    explanation = dynamo.explain(layer)(x)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    dynamo.reset()
    compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)
    grads = []
    for fn in (layer, compiled):
        xg = x.clone().requires_grad_()
        grads.append(torch.autograd.grad(fn(xg).sin().sum(), [xg, W]))
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.slow
def test_a_block_under_implicit_dense_compiles_without_graph_breaks() -> None:
    adjoint = ih.Implicit(linear_solver="dense", fixed_point_tol=None)
    explanation = dynamo.explain(block(ih.CD, adjoint, True))(torch.rand(2, 16, 6, 6).double())
    assert explanation.graph_break_count == 0, explanation.break_reasons


@pytest.mark.slow
def test_a_compiled_at_point_mode_still_checks_the_fixed_point() -> None:
    """With fixed_point_tol, the check runs eagerly in the compiled forward (a graph break)
    and warns as in eager mode."""
    W = torch.randn(8, 8, dtype=torch.float64) * 0.4
    x = torch.randn(4, 8, dtype=torch.float64, requires_grad=True)
    compiled = torch.compile(tanh_layer(ih.Neumann(5, 0.5), W), backend="eager")
    with pytest.warns(ih.NotFixedPointWarning, match="not a fixed point"):
        torch.autograd.grad(compiled(x).sum(), x)
