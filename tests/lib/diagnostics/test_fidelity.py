"""compare_adjoints: gradient fidelity of backward modes against known gradients."""

from __future__ import annotations

import json
import logging
import re

import pytest
import torch
from torch import nn

import implicit_ham as ih
from implicit_ham.diagnostics import compare_adjoints, describe_adjoint

F64 = torch.float64


def _contractive_problem(n: int = 6, batch: int = 3, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(n, n, dtype=F64, generator=gen) * 0.4 / n**0.5
    x = torch.randn(batch, n, dtype=F64, generator=gen)
    return w, x


def test_unroll_matches_implicit_and_one_step_differs_by_the_known_amount() -> None:
    """f(z) = A z + x: the fixed-point gradient of sum(c * z*) w.r.t. x is (I - A)^-T c,
    the one-step gradient is c itself (only the last step, dz/dx = I)."""
    gen = torch.Generator().manual_seed(1)
    n = 5
    a = torch.randn(n, n, dtype=F64, generator=gen) * 0.5 / n**0.5
    c = torch.randn(2, n, dtype=F64, generator=gen)
    x = torch.randn(2, n, dtype=F64, generator=gen)
    solver = ih.FixedPointIteration(max_steps=300, tol=1e-13)

    def layer(adjoint: ih.plugins.Adjoint, x: torch.Tensor) -> torch.Tensor:
        z0 = torch.zeros_like(x)
        return ih.fixed_point(lambda z, x: z @ a.T + x, z0, x, solver=solver, adjoint=adjoint).value

    rows = compare_adjoints(
        layer, x, lambda z: (c * z).sum(), [ih.Unroll(), ih.Implicit(tol=1e-12), ih.OneStep()]
    )
    by_mode = {r["adjoint"]: r for r in rows}
    ref = rows[0]
    assert ref["reference"] and ref["adjoint"].startswith("implicit(linear_solver=dense")
    for mode in ("unroll", "implicit(tol=1e-12)"):
        assert by_mode[mode]["cosine"] == pytest.approx(1.0, abs=1e-12)
        assert by_mode[mode]["rel_error"] < 1e-9
        assert by_mode[mode]["same_forward"]

    exact = torch.linalg.solve(torch.eye(n, dtype=F64) - a.T, c.T).T.reshape(-1)
    one_step = c.reshape(-1)
    cosine = float(exact @ one_step / (exact.norm() * one_step.norm()))
    row = by_mode["one_step"]
    assert cosine < 0.999
    assert row["cosine"] == pytest.approx(cosine, rel=1e-9)
    assert row["norm_ratio"] == pytest.approx(float(one_step.norm() / exact.norm()), rel=1e-9)
    assert row["rel_error"] == pytest.approx(
        float((one_step - exact).norm() / exact.norm()), rel=1e-9
    )


class RandomInitDEQ(nn.Module):
    """A tiny implicit layer with a random initial state and a settable backward mode."""

    def __init__(self, n: int, adjoint: ih.plugins.Adjoint) -> None:
        super().__init__()
        self.lin = nn.Linear(n, n, dtype=F64)
        with torch.no_grad():
            self.lin.weight.mul_(0.3)
        self.adjoint = adjoint
        self.solver = ih.FixedPointIteration(max_steps=60, tol=1e-12)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z0 = torch.randn_like(x)
        f = lambda z, x: torch.tanh(self.lin(z) + x)  # noqa: E731
        return ih.fixed_point(f, z0, x, solver=self.solver, adjoint=self.adjoint).value


def test_module_path_same_forward_with_random_init_and_parameters_compared() -> None:
    torch.manual_seed(0)
    layer = RandomInitDEQ(4, adjoint=ih.OneStep())
    x = torch.randn(3, 4, dtype=F64)
    state = torch.random.get_rng_state()
    rows = compare_adjoints(layer, x, lambda z: z.pow(2).sum(), ["unroll", ih.Truncated(2)])
    assert torch.equal(torch.random.get_rng_state(), state)  # the global RNG is untouched
    assert layer.adjoint == ih.OneStep()  # restored
    assert all(r["same_forward"] and r["forward_max_diff"] == 0.0 for r in rows)
    assert rows[1]["adjoint"] == "unroll" and rows[1]["cosine"] == pytest.approx(1.0, abs=1e-9)
    assert rows[2]["adjoint"] == "truncated(k=2)" and rows[2]["cosine"] < 1.0

    # the compared gradient covers x and the parameters: the reference norm equals a direct one
    z0_seeded = torch.random.fork_rng()
    with z0_seeded:
        torch.manual_seed(0)
        xx = x.clone().requires_grad_()
        layer.adjoint = ih.Implicit(linear_solver="dense", tol=1e-8)
        grads = torch.autograd.grad(layer(xx).pow(2).sum(), [xx, *layer.parameters()])
        layer.adjoint = ih.OneStep()
    direct = torch.cat([g.reshape(-1) for g in grads]).norm()
    assert rows[0]["grad_norm"] == pytest.approx(float(direct), rel=1e-12)


def test_forward_mismatch_is_reported(caplog: pytest.LogCaptureFixture) -> None:
    w, x = _contractive_problem()

    def layer(adjoint: ih.plugins.Adjoint, x: torch.Tensor) -> torch.Tensor:
        out = ih.fixed_point(
            lambda z, x: torch.tanh(z @ w.T + x),
            torch.zeros_like(x),
            x,
            solver=ih.FixedPointIteration(max_steps=4),
            adjoint=adjoint,
        ).value
        return out + (0.5 if isinstance(adjoint, ih.OneStep) else 0.0)

    with caplog.at_level(logging.WARNING, logger="implicit_ham.diagnostics.fidelity"):
        rows = compare_adjoints(layer, x, lambda z: z.sum(), [ih.OneStep()], reference="unroll")
    assert rows[0]["adjoint"] == "unroll"
    assert not rows[1]["same_forward"]
    assert rows[1]["forward_max_diff"] == pytest.approx(0.5)
    assert "changed the forward value" in caplog.text


def test_large_state_falls_back_to_unroll_reference() -> None:
    x = torch.randn(1, 5000, dtype=F64)

    def layer(adjoint: ih.plugins.Adjoint, x: torch.Tensor) -> torch.Tensor:
        return ih.fixed_point(
            lambda z, x: 0.5 * z + x,
            torch.zeros_like(x),
            x,
            solver=ih.FixedPointIteration(max_steps=3),
            adjoint=adjoint,
        ).value

    rows = compare_adjoints(layer, x, lambda z: z.sum(), [ih.OneStep()])
    assert rows[0]["adjoint"] == "unroll"
    # dz3/dx = 1 + 0.5 + 0.25 per entry under unroll, 1 under one-step
    assert rows[1]["norm_ratio"] == pytest.approx(1 / 1.75, rel=1e-12)


def test_rows_print_as_a_table_and_serialise() -> None:
    w, x = _contractive_problem()

    def layer(adjoint: ih.plugins.Adjoint, x: torch.Tensor) -> torch.Tensor:
        f = lambda z, x: torch.tanh(z @ w.T + x)  # noqa: E731
        return ih.fixed_point(f, torch.zeros_like(x), x, adjoint=adjoint).value

    rows = compare_adjoints(layer, [x], lambda z: z.sum(), [ih.Phantom(k=3, tau=0.5)], repeats=2)
    text = str(rows)
    header = text.splitlines()[0].split()
    assert header[:4] == ["adjoint", "reference", "cosine", "rel_error"]
    assert "phantom(k=3, tau=0.5)" in text
    assert json.loads(json.dumps(rows))[1]["adjoint"] == "phantom(k=3, tau=0.5)"
    assert all(r["backward_ms"] >= 0 and r["saved_bytes"] > 0 for r in rows)


def test_saved_bytes_grow_with_unrolled_steps_but_not_for_implicit() -> None:
    w, x = _contractive_problem()

    def run(k: int, adjoint: ih.plugins.Adjoint) -> int:
        def layer(adjoint: ih.plugins.Adjoint, x: torch.Tensor) -> torch.Tensor:
            f = lambda z, x: torch.tanh(z @ w.T + x)  # noqa: E731
            solver = ih.FixedPointIteration(max_steps=k)
            return ih.fixed_point(f, torch.zeros_like(x), x, solver=solver, adjoint=adjoint).value

        return compare_adjoints(layer, x, lambda z: z.sum(), [], reference=adjoint)[0][
            "saved_bytes"
        ]

    assert run(20, ih.Unroll()) > 3 * run(5, ih.Unroll())
    assert run(20, ih.Implicit()) == run(5, ih.Implicit())


def test_bad_layer_arguments_name_the_fix() -> None:
    with pytest.raises(TypeError, match="fn\\(adjoint, \\*inputs\\)"):
        compare_adjoints(nn.Linear(2, 2), torch.randn(1, 2), lambda y: y.sum(), ["unroll"])
    with pytest.raises(TypeError, match=r"nn\.Module with an 'adjoint'"):
        compare_adjoints(3, torch.randn(1, 2), lambda y: y.sum(), ["unroll"])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="params="):
        compare_adjoints(lambda adj, n: torch.ones(1) * n, [3], lambda y: y.sum(), ["unroll"])


def test_describe_adjoint_labels() -> None:
    assert describe_adjoint(ih.Unroll()) == "unroll"
    assert describe_adjoint(ih.Neumann(k=7)) == "neumann(k=7, tau=0.5)"
    assert (
        describe_adjoint(ih.Implicit(linear_solver="anderson"))
        == "implicit(linear_solver=anderson)"
    )


def test_auto_never_crowns_an_implicit_gradient_the_library_flags(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """NMF after 6 steps is not at a fixed point (relative residual ~3e-2) and its dense backward
    solve misses its tolerance (κ(I - J) ~1e5): the dense implicit gradient is not the layer's
    gradient there. The reference is Unroll, the exact gradient of the 6 steps it ran, and the
    table says why with the numbers."""
    torch.manual_seed(0)
    layer = ih.NMF(rank=4, steps=6)
    x = torch.rand(2, 16, 8, 8)
    loss = lambda y: y.square().sum()  # noqa: E731
    with caplog.at_level(logging.WARNING, logger="implicit_ham.diagnostics.fidelity"):
        rows = compare_adjoints(layer, x, loss, ["one_step"], warmup=False)
    reference, one_step = rows
    assert reference["adjoint"] == "unroll" and reference["reference"]
    assert layer.last_solution is not None
    assert float(layer.last_solution.stats.rel_residual.min()) > 1e-2  # the last step moved
    quoted = re.search(r"not a fixed point \(relative residual (\S+) > 1e-05\)", reference["why"])
    assert quoted is not None and float(quoted.group(1)) > 1e-2
    assert "backward solve did not converge" in reference["why"]
    assert "κ(I - J) = " in reference["why"]  # a dense solve's κ is exact, not a bound
    assert "not vouched for" in caplog.text

    def gradient(adjoint: ih.plugins.Adjoint) -> torch.Tensor:  # the same seed, directly
        with torch.random.fork_rng():
            torch.manual_seed(0)
            layer.adjoint = adjoint
            xx = x.clone().requires_grad_()
            (g,) = torch.autograd.grad(loss(layer(xx)), [xx])
        return g.reshape(-1)

    unroll, one = gradient(ih.Unroll()), gradient(ih.OneStep())
    assert reference["grad_norm"] == pytest.approx(float(unroll.norm()), rel=1e-6)
    cosine = float(unroll @ one / (unroll.norm() * one.norm()))
    assert one_step["cosine"] == pytest.approx(cosine, abs=1e-6)


def test_auto_keeps_an_implicit_gradient_it_can_vouch_for_and_says_why() -> None:
    """At a verified fixed point (tolerance 1e-12) with a converged dense solve, the reference is
    the dense implicit gradient; a returned Solution lets the reason quote its numbers."""
    w, x = _contractive_problem()
    solver = ih.FixedPointIteration(max_steps=200, tol=1e-12)

    def layer(adjoint: ih.plugins.Adjoint, x: torch.Tensor) -> ih.Solution:
        f = lambda z, x: torch.tanh(z @ w.T + x)  # noqa: E731
        return ih.fixed_point(f, torch.zeros_like(x), x, solver=solver, adjoint=adjoint)

    rows = compare_adjoints(layer, x, lambda sol: sol.value.sum(), ["unroll"])
    reference = rows[0]
    assert reference["adjoint"].startswith("implicit(linear_solver=dense")
    assert reference["why"].startswith("dense implicit gradient: at a fixed point (relative resid")
    assert "converged backward solves" in reference["why"] and "κ(I - J) = " in reference["why"]
    assert rows[1]["cosine"] == pytest.approx(1.0, abs=1e-9)
    assert "why" not in rows[1]


def test_a_reference_the_caller_chose_is_used_and_flagged_when_distrusted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    torch.manual_seed(0)
    layer = ih.NMF(rank=4, steps=6)
    logs = caplog.at_level(logging.WARNING, logger="implicit_ham.diagnostics.fidelity")
    with logs, pytest.warns(ih.NotFixedPointWarning):  # the caller's mode warns as usual
        rows = compare_adjoints(
            layer, torch.rand(2, 16, 8, 8), lambda y: y.sum(), [], reference="implicit"
        )
    assert rows[0]["adjoint"] == "implicit"
    assert rows[0]["why"].startswith("chosen by the caller; its implicit gradient is not vouched")
    assert "not vouched for" in caplog.text
