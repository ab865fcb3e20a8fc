"""What an NMF forward keeps alive: at its peak (the readout ``D C^T``), the output, the final
bases and coefficients (held by ``last_solution``), the coefficients of ``compute_coef`` and
nothing else of size n x r; the initial coefficients C0 and the iterate two steps back are
released before the readout and before each step."""

from __future__ import annotations

import weakref

import torch
from helpers.live_bytes import LiveStorageBytes

import implicit_ham as ih


def test_nmf_forward_peak_holds_two_coefficient_arrays_and_the_output() -> None:
    d, side, rank = 32, 24, 4
    n = side * side
    x = torch.rand(1, d, side, side, generator=torch.Generator().manual_seed(0))
    layer = ih.NMF(rank=rank, steps=6, eval_steps=6).eval()
    with torch.no_grad():
        layer(x)  # a previous forward's last_solution is released when the next one replaces it
        with LiveStorageBytes(ignore=(x,)) as live:
            out = layer(x)
    item = x.element_size()
    output, coef, bases = d * n * item, n * rank * item, d * rank * item
    # the output, C_K (last_solution), C_{K+1}, D_K, and the previous forward's D / C are gone
    expected = output + 2 * coef + bases
    small = sum(b for b, _, _ in live.at_peak if b < bases)  # (B,) stats, r x r Grams
    assert live.peak - small == expected, live.at_peak
    assert out.shape == x.shape


def test_fixed_budget_iteration_keeps_two_states_alive() -> None:
    """``prev = z`` before each step: while f builds z_{k+1}, only z_k (and z_{k-1}, kept for
    the residual of the last step) are alive, not z_{k-2} as well."""
    width = 4096
    z0 = torch.zeros(2, width)

    def f(z: torch.Tensor) -> torch.Tensor:
        return 0.5 * z + 1.0  # one temporary (0.5 z), then the new state

    with torch.no_grad(), LiveStorageBytes(ignore=(z0,)) as live:
        ih.fixed_point(f, z0, solver=ih.FixedPointIteration(max_steps=8))
    state = 2 * width * z0.element_size()
    small = sum(b for b, _, _ in live.at_peak if b < state)
    # z_{k-1}, z_k and the temporary 0.5 z_k (or, at the end, the change z_K - z_{K-1})
    assert live.peak - small == 3 * state, live.at_peak


def test_the_previous_forwards_state_is_released_before_the_next_solve() -> None:
    """``last_solution`` of one forward is dropped when the next forward starts, not when its
    solve ends: the solve never holds the old (D, C) beside its own iterates."""
    seen: list[bool] = []

    class Probe(ih.FixedPointIteration):
        def solve_replaying(self, f, z0, spec, grad_steps):  # type: ignore[no-untyped-def]
            seen.append(previous is not None and previous() is None)
            return super().solve_replaying(f, z0, spec, grad_steps)

    x = torch.rand(1, 16, 8, 8, generator=torch.Generator().manual_seed(0))
    layer = ih.NMF(rank=3, steps=4, eval_steps=4, solver=Probe(max_steps=4)).eval()
    previous = None
    with torch.no_grad():
        layer(x)
        assert layer.last_solution is not None
        previous = weakref.ref(layer.last_solution.value[1])
        layer(x)
    assert seen == [False, True]
    assert layer.last_solution is not None and layer.last_solution.stats.steps == 4
