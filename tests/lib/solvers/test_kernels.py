"""The building blocks of the fast path: in-place helpers, the per-solve memo of loop
invariants, the one-pass finiteness check, and no host synchronisation per iteration."""

from __future__ import annotations

import pytest
import torch
from torch.overrides import TorchFunctionMode

import implicit_ham as ih
from implicit_ham.decompositions.fused import multiplicative_update, normalize_over_n

SYNCING = {"__bool__", "__float__", "__int__", "__index__", "item", "tolist", "numpy"}


def operands(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.rand(2, 7, 3, generator=gen, dtype=torch.float64) for _ in range(3))


def test_multiplicative_update_in_place_equals_the_formula_and_spares_value():
    value, numer, denom = operands()
    expected = value * numer / (denom + 1e-6)
    value_before = value.clone()
    with torch.no_grad():
        out = multiplicative_update(value, numer.clone(), denom.clone(), 1e-6)
    torch.testing.assert_close(out, expected, rtol=1e-15, atol=0)
    assert torch.equal(value, value_before)
    num2, den2 = numer.clone(), denom.clone()
    with torch.no_grad():
        in_place = multiplicative_update(value, num2, den2, 1e-6)
    assert in_place.data_ptr() == num2.data_ptr()  # written into the caller's temporary
    out_of_place = multiplicative_update(value, numer.requires_grad_(), denom, 1e-6)
    assert out_of_place.requires_grad and out_of_place.data_ptr() != numer.data_ptr()
    assert torch.equal(in_place, out_of_place.detach())  # same operations, same order


def test_normalize_over_n_in_and_out_of_place():
    coef, _, _ = operands(1)
    expected = coef / (coef.sum(dim=1, keepdim=True) + 1e-6)
    with torch.no_grad():
        got = normalize_over_n(coef.clone(), 1e-6)
    assert torch.equal(got, normalize_over_n(coef.requires_grad_(), 1e-6).detach())
    torch.testing.assert_close(got, expected, rtol=1e-15, atol=0)


class CountingCD(ih.CD):
    """CD that counts how often its loop invariants are computed."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.invariant_calls = 0

    def loop_invariants(self, x):
        self.invariant_calls += 1
        return super().loop_invariants(x)


@pytest.mark.parametrize(
    "adjoint, expected_calls",
    [(ih.OneStep(), 1), (ih.Unroll(), 1), (ih.Implicit(linear_solver="dense"), 2)],
    ids=["one_step", "unroll", "implicit"],
)
def test_loop_invariants_are_computed_once_per_solve_and_grad_mode(adjoint, expected_calls):
    """OneStep: the K steps under no-grad share one computation; Unroll: one with gradient;
    Implicit: one for the no-grad solve, one for f re-evaluated with gradient at z*."""
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(1, 6, 3, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    layer = CountingCD(rank=2, steps=6, adjoint=adjoint, inv_t=3.0)
    layer(x).sum().backward()
    assert layer.invariant_calls == expected_calls
    assert layer.last_solution.stats.steps == 6


def test_iteration_map_is_a_pure_function_of_its_argument():
    """A different X, or the same X changed in place, gets its own invariants: f(z, X2) is
    step(X2, z), never a stale memo of X."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(1, 6, 3, 4, generator=gen, dtype=torch.float64)
    layer = ih.VQ(rank=2, inv_t=3.0)
    problem = layer.implicit_problem(x)
    flat = problem.args[0]
    z = problem.z0
    problem.f(z, flat)
    other = 3.0 * flat + 1.0
    for arg in (other, flat.mul_(2.0)):
        for got, want in zip(problem.f(z, arg), layer.step(arg, z), strict=True):
            assert torch.equal(got, want)


class SyncCounter(TorchFunctionMode):
    """Counts the Tensor methods that copy a value to the host (a device synchronisation)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in SYNCING:
            self.count += 1
        return func(*args, **(kwargs or {}))


def syncs(kind: str, steps: int, check_finite: bool = True) -> int:
    solver = ih.FixedPointIteration(check_finite=check_finite)
    layer = ih.make_decomposition(kind, rank=2, steps=steps, solver=solver)
    x = torch.rand(1, 6, 3, 4, dtype=torch.float64, requires_grad=True)
    with SyncCounter() as counter:
        layer(x).sum().backward()
    return counter.count


# a deliberate subset: the three base decompositions (Hamburger's NMF, VQ, CD)
@pytest.mark.parametrize("kind", ["nmf", "vq", "cd"])
def test_host_synchronisations_do_not_grow_with_k(kind):
    """Per forward: the input's finiteness and, for NMF, the sign of input and bases (one, the
    same pass), the solver's finite check (one, removed by check_finite=False); none per
    iteration."""
    per_solve = 2
    assert syncs(kind, 1) == syncs(kind, 9) == per_solve
    assert syncs(kind, 9, check_finite=False) == per_solve - 1


@pytest.mark.filterwarnings("ignore:.*torch.jit.script.*:DeprecationWarning")
@pytest.mark.parametrize("kind", ["nmf", "vq", "cd"])  # the base decompositions, as above
def test_fast_path_under_torch_func_inside_no_grad(kind):
    """The diagnostics' "func" backend calls torch.func.jvp / vjp on f inside no_grad, where
    the in-place path is active: products must match autograd's (forward AD rejects out=)."""
    gen = torch.Generator().manual_seed(4)
    x = torch.rand(1, 6, 3, 4, generator=gen, dtype=torch.float64) + 0.1
    layer = ih.make_decomposition(kind, rank=2, inv_t=None if kind == "nmf" else 3.0)
    problem = layer.implicit_problem(x if kind == "nmf" else x - 0.5)
    z = tuple(t.detach() for t in problem.z0)
    v = tuple(torch.randn(t.shape, generator=gen, dtype=t.dtype) for t in z)

    def f(*state):
        return problem.f(state, problem.args[0])

    with torch.no_grad():
        _, jv = torch.func.jvp(f, z, v)
        _, pullback = torch.func.vjp(f, *z)
        vj = pullback(v)
    _, jv_ref = torch.autograd.functional.jvp(f, z, v)
    _, vj_ref = torch.autograd.functional.vjp(f, z, v)
    for got, want in zip((*jv, *vj), (*jv_ref, *vj_ref), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("solver", [ih.Anderson(max_steps=60, tol=1e-9),
                                    ih.Broyden(max_steps=60, tol=1e-9)])  # fmt: skip
def test_accelerated_solvers_keep_the_best_iterate_without_aliasing_z0(solver):
    """The native solvers keep an evaluation that improved every sample by reference (no
    ``where`` over the states); the caller's z0 is never returned that way, and the value
    kept is the evaluated iterate with the lowest residual, as the stats say."""
    gen = torch.Generator().manual_seed(0)
    weight = 0.5 * torch.linalg.qr(torch.randn(6, 6, generator=gen, dtype=torch.float64))[0]
    x = torch.randn(3, 6, generator=gen, dtype=torch.float64)

    def f(z, x):
        return torch.tanh(z @ weight.T + x)

    with torch.no_grad():
        sol = ih.fixed_point(f, torch.zeros(3, 6, dtype=torch.float64), x, solver=solver)
        residual = (f(sol.value, x) - sol.value).norm(dim=1)
        torch.testing.assert_close(residual, sol.stats.abs_residual, rtol=1e-12, atol=1e-300)
        assert bool((residual <= 1e-9 * f(sol.value, x).norm(dim=1)).all())
        # z0 already at the fixed point: the first evaluation is the best, and not z0 itself
        z_star = sol.value.clone()
        again = ih.fixed_point(f, z_star, x, solver=solver)
    assert again.value.data_ptr() != z_star.data_ptr()
    torch.testing.assert_close(again.value, z_star, rtol=0, atol=0)
