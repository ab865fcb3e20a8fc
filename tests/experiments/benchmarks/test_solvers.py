"""Issue 15: the native Anderson / Broyden against torchdeq's (same run), GMRES's host reads
and agreement with the previous (stacked-basis, lstsq) GMRES, the opt-in residual trace of
FixedPointIteration, and a smoke run of ``experiments.benchmarks.peers.run``. No timings: speed
lives in the benchmark."""

from __future__ import annotations

import pytest
import torch
from helpers.host_sync import HostSyncCounter
from torch import Tensor

import implicit_ham as ih
from experiments.benchmarks.peers import run as bench_peers
from experiments.benchmarks.peers.deq import DEQ_TRAIN_PROBLEMS, deq_train_cases
from experiments.benchmarks.peers.gmres import StackedGMRES
from experiments.benchmarks.peers.official_hams import OFFICIAL
from implicit_ham.linalg.operator import AdjointOperator

DT = torch.float64


def tanh_map(batch: int = 4, width: int = 12, contraction: float = 0.8, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(width, width, generator=gen, dtype=DT)
    weight = contraction * weight / torch.linalg.matrix_norm(weight, ord=2)
    x = torch.randn(batch, width, generator=gen, dtype=DT)
    calls = [0]

    def f(z: Tensor) -> Tensor:
        calls[0] += 1
        return torch.tanh(z @ weight.T + x)

    return f, torch.zeros(batch, width, dtype=DT), calls


# --- native Anderson / Broyden vs torchdeq's -------------------------------------------------


@pytest.mark.parametrize("stop_mode", ["rel", "abs"])
@pytest.mark.parametrize(
    ("native", "reference"),
    [
        (ih.Anderson, ih.solvers.TorchDEQAnderson),
        (ih.Broyden, ih.solvers.TorchDEQBroyden),
    ],
    ids=["anderson", "broyden"],
)
def test_native_solver_finds_torchdeqs_fixed_point_with_no_more_evaluations(
    native, reference, stop_mode
) -> None:
    f, z0, calls = tanh_map()
    counts, values = [], []
    for cls in (native, reference):
        calls[0] = 0
        with torch.no_grad():
            sol = ih.fixed_point(
                f, z0, solver=cls(max_steps=40, tol=1e-8, stop_mode=stop_mode),
                adjoint=ih.Implicit(),
            )  # fmt: skip
        counts.append(calls[0])
        values.append(sol.value)
        assert bool(sol.stats.converged.all())
    assert counts[0] <= counts[1]
    torch.testing.assert_close(values[0], values[1], rtol=0, atol=1e-7)


@pytest.mark.parametrize("native", [ih.Anderson, ih.Broyden], ids=["anderson", "broyden"])
def test_native_solver_returns_an_evaluated_iterate_and_its_exact_residual(native) -> None:
    f, z0, calls = tanh_map(contraction=0.95)
    with torch.no_grad():
        sol = ih.fixed_point(f, z0, solver=native(max_steps=12, tol=None), adjoint=ih.Implicit())
        fz = f(sol.value)
    # the budget's 12 evaluations in the solve (its best iterates share the last one, so no
    # measurement at the returned point), one here
    assert calls[0] == 13
    residual = (fz - sol.value).norm(dim=1)
    torch.testing.assert_close(sol.stats.abs_residual, residual, rtol=1e-12, atol=0)
    assert sol.stats.residuals.shape == (12, 4) and sol.stats.steps == 12


@pytest.mark.parametrize("native", [ih.Anderson, ih.Broyden], ids=["anderson", "broyden"])
@pytest.mark.filterwarnings("ignore::implicit_ham.ConvergenceWarning")  # tol=1e-30 on purpose
def test_native_solver_syncs_once_per_evaluation_with_a_tolerance_once_without(native) -> None:
    f, z0, _ = tanh_map(contraction=0.99)
    counts = {}
    for tol in (None, 1e-30):
        for budget in (10, 20):
            with HostSyncCounter() as counter, torch.no_grad():
                sol = ih.fixed_point(
                    f, z0, solver=native(max_steps=budget, tol=tol), adjoint=ih.Implicit()
                )
            counts[(tol, budget)] = (counter.syncs, sol.stats.steps)
    # none per evaluation; per solve the finiteness check with the pick of the returned point,
    # and the check of the returned point as one batch (an f that couples the samples)
    assert counts[(None, 10)][0] == counts[(None, 20)][0] <= 2
    (few, few_evals), (many, many_evals) = counts[(1e-30, 10)], counts[(1e-30, 20)]
    assert (few_evals, many_evals) == (10, 20)
    # one per evaluation (the stopping decision); per solve, the read of whether the returned
    # point is the latest evaluated batch happens only when it is not that batch by reference
    assert abs((many - few) - (many_evals - few_evals)) <= 1


def test_native_anderson_value_is_the_same_under_every_backward_mode() -> None:
    gen = torch.Generator().manual_seed(4)
    weight = 0.5 * torch.randn(6, 6, generator=gen, dtype=DT) / 6**0.5
    x = torch.randn(3, 6, generator=gen, dtype=DT, requires_grad=True)

    def f(z: Tensor, x: Tensor) -> Tensor:
        return torch.tanh(z @ weight.T + x)

    solver = ih.Anderson(max_steps=15, tol=None)
    z0 = torch.zeros(3, 6, dtype=DT)
    values = [
        ih.fixed_point(f, z0, x, solver=solver, adjoint=adjoint).value
        for adjoint in (ih.OneStep(), ih.Truncated(3), ih.Phantom(2, 0.5), ih.Implicit())
    ]
    for value in values[1:]:
        assert torch.equal(value, values[0])


# --- GMRES ----------------------------------------------------------------------------------


def linear_operator(size: int = 40, seed: int = 0, scale: float = 0.9):
    gen = torch.Generator().manual_seed(seed)
    jac = torch.randn(size, size, generator=gen, dtype=DT)
    jac = scale * jac / torch.linalg.matrix_norm(jac, ord=2)
    op = AdjointOperator(lambda g: jac.T @ g, lambda rows: rows @ jac, size)
    return op, torch.randn(size, generator=gen, dtype=DT), jac


@pytest.mark.parametrize(("steps", "restart"), [(12, 30), (25, 8)])
def test_gmres_reads_the_host_once_per_arnoldi_step_and_per_cycle(steps, restart) -> None:
    op, v, _ = linear_operator()
    solver = ih.linalg.GMRES(restart=restart)
    with HostSyncCounter() as counter:
        _, used, _ = solver.solve(op, v, steps, 1e-30)  # never converges: every step runs
    cycles = -(-steps // (restart + 1))
    assert used == steps
    # one read for ||v||, one per Arnoldi step, one per restart residual
    assert counter.syncs <= 1 + steps + cycles


@pytest.mark.parametrize(("steps", "restart"), [(10, 30), (30, 30), (40, 7)])
def test_gmres_matches_the_previous_stacked_basis_lstsq_gmres(steps, restart) -> None:
    op, v, _ = linear_operator(scale=0.97)
    old = StackedGMRES()
    old.restart = restart
    g_new, used_new, cond = ih.linalg.GMRES(restart=restart).solve(op, v, steps, 1e-12)
    g_old, used_old, _ = old.solve(op, v, steps, 1e-12)
    assert used_new == used_old
    torch.testing.assert_close(g_new, g_old, rtol=1e-10, atol=1e-12)
    assert cond is not None and cond >= 1.0


def test_gmres_solves_to_the_dense_solution() -> None:
    op, v, jac = linear_operator()
    g, _, cond = ih.linalg.GMRES().solve(op, v, 60, 1e-12)
    exact = torch.linalg.solve(torch.eye(40, dtype=DT) - jac.T, v)
    torch.testing.assert_close(g, exact, rtol=1e-9, atol=1e-10)
    assert cond <= float(torch.linalg.cond(torch.eye(40, dtype=DT) - jac)) * (1 + 1e-9)


# --- FixedPointIteration: the opt-in trace --------------------------------------------------


def test_untraced_solve_reports_the_last_step_and_equals_the_traced_one() -> None:
    f, z0, _ = tanh_map()
    plain = ih.fixed_point(f, z0, solver=ih.FixedPointIteration(max_steps=7))
    traced = ih.fixed_point(f, z0, solver=ih.FixedPointIteration(max_steps=7, trace=True))
    assert torch.equal(plain.value, traced.value)
    assert traced.stats.residuals.shape == (7, 4) and plain.stats.residuals.shape == (1, 4)
    assert plain.stats.steps == traced.stats.steps == 7
    assert torch.equal(plain.stats.residuals[0], traced.stats.residuals[-1])
    assert torch.equal(plain.stats.rel_residual, traced.stats.rel_residual)


def test_untraced_solve_names_a_non_finite_step_that_later_disappears() -> None:
    """A NaN at step 2 that the map clears afterwards still stops a traced solve, and the
    replay names the step (untraced, the check runs once on the final state: docs/solvers.md)."""

    def f(z: Tensor) -> Tensor:
        step = z[:, :1] + 1
        flag = torch.where(step == 2, torch.full_like(step, float("nan")), torch.zeros_like(step))
        return torch.cat([step, torch.nan_to_num(z[:, 1:], nan=0.0) * 0.5 + flag], dim=1)

    z0 = torch.zeros(2, 3, dtype=DT)
    with pytest.raises(ih.NonFiniteError, match=r"state\[0\] at forward step 2"):
        ih.fixed_point(f, z0, solver=ih.FixedPointIteration(max_steps=6, trace=True))


@pytest.mark.parametrize("name", ["nmf", "vq", "cd"])
def test_ham_forward_has_one_host_read_beyond_its_input_checks(name) -> None:
    layer = ih.make_decomposition(name, rank=4, steps=3, eval_steps=3)
    x = torch.rand(1, 16, 8, 8)
    counts = []
    for steps in (3, 12):
        layer.steps = layer.eval_steps = steps
        with HostSyncCounter() as counter, torch.no_grad():
            layer(x)
        counts.append(counter.syncs)
    assert counts[0] == counts[1]


# --- the benchmark runs ---------------------------------------------------------------------


def test_bench_peers_writes_its_table_as_a_page(tmp_path) -> None:
    page = tmp_path / "benchmarks_peers.md"
    table = bench_peers.main(["--only", "solvers", "--rounds", "1", "--markdown", str(page)])
    assert len(table.rows) == 4
    text = page.read_text()
    assert "python -m experiments.benchmarks.peers.run --only solvers" in text
    assert "| 2. Anderson forward |" in text


@pytest.mark.parametrize("problem", sorted(DEQ_TRAIN_PROBLEMS))
def test_deq_training_step_cases_compute_the_same_weight_gradient(problem: str) -> None:
    """The training-step rows time the same computation on both sides: dL/dW of the library's
    step equals torchdeq's (Anderson forward, fixed-point backward) to the solvers' tolerance
    (relative difference of the whole tensor), and a second call gives the same gradient
    (nothing accumulates across rounds)."""
    ours, peer = deq_train_cases("fixed_point", 1e-5, 1e-6, problem)
    first = ours().clone()
    theirs = peer().clone()
    assert float((first - theirs).norm() / theirs.norm()) < 1e-4
    torch.testing.assert_close(ours(), first, rtol=0, atol=0)


def test_official_formulation_matches_the_library_hams() -> None:
    """The peer computes the same function as the library's ham (same initial bases)."""
    torch.manual_seed(0)
    x = torch.rand(2, 32, 8, 8, dtype=DT)
    for name in ("nmf", "vq", "cd"):
        official = OFFICIAL[name](rank=4, steps=3, eval_steps=3)
        ours = ih.make_decomposition(name, rank=4, steps=3, eval_steps=3)
        torch.manual_seed(1)
        expected = official(x)
        torch.manual_seed(1)
        bases = official.build_bases(2, 32, x.view(2, 32, 64))
        got = ours(x, init=bases)
        torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-8)
