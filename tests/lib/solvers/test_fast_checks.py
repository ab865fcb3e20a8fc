"""The checks the fast paths keep: a NaN injected at step k is reported with its step; NMF's
input is still checked for sign and finiteness (one pass, one sync); the shared ``X^T D0``
removes one large product per forward without changing the value."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

import implicit_ham as ih

DT = torch.float64


def nan_from_step(k: int):
    """A contraction on (u, c) whose c counts steps; from step k on, u holds a NaN."""

    def f(state: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        u, c = state
        step = c + 1
        poison = torch.where(step >= k, torch.nan, 0.0)
        return 0.5 * u + poison, step

    return f


@pytest.mark.parametrize("k", [1, 3, 7])
@pytest.mark.parametrize("trace", [False, True])
def test_fixed_budget_finite_check_names_the_step_of_a_nan(k: int, trace: bool) -> None:
    z0 = (torch.ones(2, 3, dtype=DT), torch.zeros(2, 1, dtype=DT))
    solver = ih.FixedPointIteration(max_steps=8, trace=trace)
    with pytest.raises(ih.NonFiniteError, match=rf"state\[0\] at forward step {k}\b"):
        ih.fixed_point(nan_from_step(k), z0, solver=solver)


def test_fixed_budget_finite_check_is_one_sync_and_off_with_check_finite_false() -> None:
    z0 = (torch.ones(2, 3, dtype=DT), torch.zeros(2, 1, dtype=DT))
    off = ih.FixedPointIteration(max_steps=8, check_finite=False)
    sol = ih.fixed_point(nan_from_step(3), z0, solver=off)
    assert bool(torch.isnan(sol.value[0]).all())


def test_a_nan_at_step_k_is_named_with_a_tolerance_too() -> None:
    z0 = (torch.ones(2, 3, dtype=DT), torch.zeros(2, 1, dtype=DT))
    solver = ih.FixedPointIteration(max_steps=50, tol=1e-12)
    with pytest.raises(ih.NonFiniteError, match=r"forward step 4\b"):
        ih.fixed_point(nan_from_step(4), z0, solver=solver)


@pytest.mark.parametrize("kind", ["nmf", "nmf_normalized", "nmf_ridge"])
def test_nmf_still_refuses_negative_and_non_finite_inputs(kind: str) -> None:
    layer = ih.make_decomposition(kind, rank=2)
    x = torch.rand(1, 6, 3, 4, dtype=DT)
    bad = x.clone()
    bad[0, 2, 1, 1] = -0.25
    with pytest.raises(ValueError, match=r"non-negative input, got a minimum of -0.25"):
        layer(bad)
    bad[0, 2, 1, 1] = float("nan")
    with pytest.raises(ih.NonFiniteError, match="NaN or infinity"):
        layer(bad)
    bases = F.normalize(torch.rand(1, 6, 2, dtype=DT), dim=1)
    bases[0, 0, 0] = -0.5
    with pytest.raises(ValueError, match=r"non-negative initial bases, got a minimum of -0.5"):
        layer(x, init=bases)


@pytest.mark.parametrize("kind", ["vq", "cd"])
def test_signed_layers_accept_negative_inputs_and_refuse_non_finite_ones(kind: str) -> None:
    layer = ih.make_decomposition(kind, rank=2)
    x = torch.randn(1, 6, 3, 4, dtype=DT)
    assert bool(torch.isfinite(layer(x)).all())
    x[0, 1, 0, 0] = float("inf")
    with pytest.raises(ih.NonFiniteError, match="NaN or infinity"):
        layer(x)


class LargeProducts(TorchDispatchMode):
    """Counts the batched products with all three sizes d x n x r of the NMF problem."""

    def __init__(self, sizes: set[int]) -> None:
        super().__init__()
        self.sizes, self.count = sizes, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.bmm.default:
            a, b = args[0], args[1]
            if {a.shape[1], a.shape[2], b.shape[2]} == self.sizes:
                self.count += 1
        return func(*args, **(kwargs or {}))


def test_nmf_forward_shares_x_transpose_d0_with_the_first_step() -> None:
    """K = 6: 14 products of size d x n x r (init 1 shared with step 1, 2 per step, the final
    C update, the readout) instead of 15; the value equals the unshared computation bitwise."""
    d, n, r = 12, 20, 3
    x = torch.rand(1, d, 4, 5, dtype=DT)
    bases = F.normalize(torch.rand(1, d, r, dtype=DT), dim=1)
    layer = ih.NMF(rank=r, steps=6, eval_steps=6).eval()
    with LargeProducts({d, n, r}) as counter, torch.no_grad():
        out = layer(x, init=bases)
    assert counter.count == 14
    flat = x.reshape(1, d, n)
    with torch.no_grad():
        state = layer.init(flat, bases)  # the plain path: no map, nothing shared
        for _ in range(6):
            state = layer.step(flat, state)
        expected = layer.readout(flat, state).reshape(x.shape)
    assert torch.equal(out, expected)


def test_shared_product_is_used_once_and_only_for_its_own_state() -> None:
    x = torch.rand(1, 6, 3, 4, dtype=DT)
    layer = ih.NMF(rank=2)
    problem = layer.implicit_problem(x, init=F.normalize(torch.rand(1, 6, 2, dtype=DT), dim=1))
    z0 = problem.z0
    other = tuple(t.clone() for t in z0)
    first_other = problem.f(other, problem.args[0])  # not the kept state: computes its own
    first = problem.f(z0, problem.args[0])  # the kept state: uses the shared product
    again = problem.f(z0, problem.args[0])  # used once: recomputed, same value
    for a, b, c in zip(first, again, first_other, strict=True):
        assert torch.equal(a, b) and torch.equal(a, c)


@pytest.mark.parametrize("tol", [None, 1e-3])
def test_finite_steps_whose_norms_sum_past_the_float_range_are_not_called_non_finite(tol) -> None:
    """The finiteness test reads the sum of the per-sample change norms (one reduction); two
    finite norms of 3e38 sum to inf in float32, which the exact test must then clear."""
    z0 = torch.zeros(2, 1)

    def f(z: Tensor) -> Tensor:
        return torch.full_like(z, 3e38)

    solver = ih.FixedPointIteration(max_steps=2, tol=tol)
    sol = ih.fixed_point(f, z0, solver=solver)
    assert torch.equal(sol.value, torch.full((2, 1), 3e38))
    assert bool(torch.isfinite(sol.stats.abs_residual).all())


def test_tolerance_stops_and_converged_flags_match_a_per_sample_reference() -> None:
    """The loop stops a sample on ``res - tol * size <= 0`` (no division per step): each
    sample's step count equals a by-hand loop's first k with ``||f(z) - z|| / ||f(z)|| <= tol``
    (float64, the sample alone), and ``converged`` agrees with the stop (no warning)."""
    gen = torch.Generator().manual_seed(0)
    rates = torch.tensor([0.2, 0.5, 0.7, 0.9], dtype=DT)[:, None]
    x = torch.randn(4, 16, generator=gen, dtype=DT)

    def f(z: Tensor) -> Tensor:
        return rates * torch.tanh(z) + x

    tol = 1e-9
    expected = []
    for i in range(4):
        z = torch.zeros(1, 16, dtype=DT)
        for k in range(1, 500):
            fz = rates[i : i + 1] * torch.tanh(z) + x[i : i + 1]
            if float((fz - z).norm() / fz.norm()) <= tol:
                expected.append(k)
                break
            z = fz
    solver = ih.FixedPointIteration(max_steps=500, tol=tol)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sol = ih.fixed_point(f, torch.zeros(4, 16, dtype=DT), solver=solver)
    assert sol.stats.steps_per_sample().tolist() == expected
    assert bool(sol.stats.converged.all())
    assert bool((sol.stats.rel_residual <= tol).all())
    assert len(set(expected)) == 4  # the samples really stopped at different steps
