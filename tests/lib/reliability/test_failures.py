"""Failure policy of implicit layers in training (GuardedStep, FailureMonitor).

A small model with a fixed-point layer z = tanh(0.5 W z + x) is made to fail on purpose: a
forward tolerance it cannot reach in 2 steps, an implicit backward with a 1-VJP budget, a NaN
input, a NaN parameter, a NaN gradient. References are computed independently in each test
(a model copy trained by hand with the one-step gradient, or the parameters left untouched).
"""

from __future__ import annotations

import copy
import logging
import warnings

import pytest
import torch
from torch import Tensor, nn

import implicit_ham as ih
from implicit_ham.errors import ForwardSolveError
from implicit_ham.reliability.failures import FailureMonitor
from implicit_ham.reliability.guard import GuardedStep

WIDTH, CLASSES = 4, 3


class TanhLayer(nn.Module):
    """Implicit layer: (B, n) -> the fixed point of z = tanh(0.5 W z + x)."""

    def __init__(self, solver: ih.plugins.FixedPointSolver, adjoint: ih.plugins.Adjoint) -> None:
        super().__init__()
        self.lin = nn.Linear(WIDTH, WIDTH, bias=False)
        self.solver, self.adjoint = solver, adjoint
        self.last_solution: ih.Solution | None = None

    def forward(self, x: Tensor) -> Tensor:
        sol = ih.fixed_point(
            lambda z, x: torch.tanh(0.5 * self.lin(z) + x),
            torch.zeros_like(x),
            x,
            solver=self.solver,
            adjoint=self.adjoint,
        )
        self.last_solution = sol
        return sol.value


class NaNGradient(torch.autograd.Function):
    """Identity forward, NaN gradient backward."""

    @staticmethod
    def forward(ctx: object, x: Tensor) -> Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: object, grad: Tensor) -> Tensor:
        return torch.full_like(grad, float("nan"))


class Model(nn.Module):
    def __init__(
        self,
        solver: ih.plugins.FixedPointSolver,
        adjoint: ih.plugins.Adjoint,
        nan_grad: bool = False,
    ) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.inp = nn.Linear(WIDTH, WIDTH).double()
        self.norm = nn.BatchNorm1d(WIDTH).double()
        self.layer = TanhLayer(solver, adjoint).double()
        self.out = nn.Linear(WIDTH, CLASSES).double()
        self.nan_grad = nan_grad

    def forward(self, x: Tensor) -> Tensor:
        h = self.norm(self.inp(x))
        if self.nan_grad:
            h = NaNGradient.apply(h)
        return self.out(self.layer(h))


class Task:
    """The loss ``GuardedStep`` asks for: cross-entropy of (B, CLASSES) logits."""

    def loss(self, logits: Tensor, target: Tensor) -> Tensor:
        return torch.nn.functional.cross_entropy(logits, target)


TASK = Task()
MISS = ih.FixedPointIteration(max_steps=2, tol=1e-12)
EXACT = ih.FixedPointIteration(max_steps=40)


def _batch() -> tuple[Tensor, Tensor]:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(6, WIDTH, generator=gen, dtype=torch.float64)
    return x, torch.randint(0, CLASSES, (6,), generator=gen)


def _guard(model: nn.Module, policy: str, **kwargs: object) -> tuple[GuardedStep, list]:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    rows: list[dict] = []

    class Sink:
        def log(self, metrics: dict, step: int) -> None:
            rows.append(metrics)

        def log_table(self, name: str, table: list, step: int | None = None) -> None:
            rows.extend({"table": name, **r} for r in table)

    monitor = FailureMonitor([Sink()], **kwargs)  # type: ignore[arg-type]
    return GuardedStep(model, TASK, optimizer, policy=policy, monitor=monitor), rows


def _state(model: nn.Module) -> dict[str, Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def _one_step_reference(model: nn.Module, x: Tensor, y: Tensor) -> dict[str, Tensor]:
    """The model after one SGD step (lr 0.1) with the one-step gradient, done by hand."""
    ref = copy.deepcopy(model)
    ref.layer.adjoint = ih.OneStep()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ih.ConvergenceWarning)
        loss = TASK.loss(ref(x), y)
    loss.backward()
    with torch.no_grad():
        for p in ref.parameters():
            p -= 0.1 * p.grad
    return ref.state_dict()


def _fallback_reference(model: nn.Module, x: Tensor, y: Tensor, steps: int) -> dict[str, Tensor]:
    """The parameters after one SGD step (lr 0.1) with the fallback gradient g = v, by hand:
    the gradient of f(z, x) at the detached ``steps``-step iterate z, carrying z's value."""
    ref = copy.deepcopy(model)
    h = ref.norm(ref.inp(x))
    with torch.no_grad():
        z = h.new_zeros(h.shape)
        for _ in range(steps):
            z = torch.tanh(0.5 * ref.layer.lin(z) + h)
    f_z = torch.tanh(0.5 * ref.layer.lin(z) + h)
    TASK.loss(ref.out(z + f_z - f_z.detach()), y).backward()
    with torch.no_grad():
        return {name: q - 0.1 * q.grad for name, q in ref.named_parameters()}


def _assert_parameters(model: nn.Module, expected: dict[str, Tensor]) -> None:
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.detach(), expected[name], rtol=0, atol=1e-12, msg=name)


def test_fallback_recomputes_a_missed_forward_with_the_one_step_gradient() -> None:
    model = Model(MISS, ih.Implicit(linear_solver="dense"))
    x, y = _batch()
    expected = _one_step_reference(model, x, y)
    guard, rows = _guard(model, "fallback")
    assert guard(x, y, step=0) is not None
    for key, value in model.state_dict().items():
        torch.testing.assert_close(value, expected[key], rtol=0, atol=1e-12, msg=key)
    assert guard.monitor.summary()["by_kind"] == {"forward_not_converged": 1}
    (row,) = rows
    assert row["layer"] == "layer" and row["action"] == "fallback" and row["residual"] > 1e-12


def test_fallback_replaces_a_failed_backward_solve_by_v() -> None:
    """Fallback g = v: the gradient is that of f(z*, x) at the detached fixed point z*."""
    model = Model(EXACT, ih.Implicit(linear_solver="gmres", max_steps=1, tol=1e-14))
    x, y = _batch()
    expected = _fallback_reference(model, x, y, steps=40)
    guard, rows = _guard(model, "fallback")
    guard(x, y, step=3)
    _assert_parameters(model, expected)
    assert [(r["kind"], r["step"], r["action"]) for r in rows] == [
        ("backward_not_converged", 3, "fallback")
    ]
    assert model.layer.last_solution.backward_stats.fallback


def test_skip_batch_leaves_parameters_and_buffers_untouched() -> None:
    model = Model(MISS, ih.OneStep())
    before = _state(model)
    guard, rows = _guard(model, "skip_batch")
    assert guard(*_batch(), step=0) is None
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key
    assert rows[0]["action"] == "skipped"


def test_raise_names_layer_step_and_residual() -> None:
    guard, _ = _guard(Model(MISS, ih.OneStep()), "raise")
    with pytest.raises(ForwardSolveError, match=r"step 7: forward solve of layer layer .*e-"):
        guard(*_batch(), step=7)
    guard, _ = _guard(Model(EXACT, ih.Implicit("gmres", max_steps=1, tol=1e-14)), "raise")
    with pytest.raises(ih.errors.BackwardSolveError, match="layer layer failed"):
        guard(*_batch(), step=0)
    assert guard.monitor.summary()["by_action"] == {"raised": 1}


def test_warn_counts_every_event_and_rate_limits_warnings(
    caplog: pytest.LogCaptureFixture,
) -> None:
    model = Model(MISS, ih.OneStep())
    guard, rows = _guard(model, "warn", warn_first=2, warn_every=4)
    before = _state(model)
    with caplog.at_level(logging.WARNING), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(9):
            guard(*_batch(), step=step)
    assert not [w for w in caught if issubclass(w.category, ih.ConvergenceWarning)]
    numbers = [r.args[0] for r in caplog.records if "failure #" in r.getMessage()]
    assert numbers == [1, 2, 4, 8]
    assert guard.monitor.summary()["total"] == 9 == len(rows)
    assert not torch.equal(model.out.weight, before["out.weight"])


@pytest.mark.parametrize("policy", ["skip_batch", "fallback"])
def test_non_finite_forward_is_skipped_and_counted(policy: str) -> None:
    model = Model(EXACT, ih.OneStep())
    before = _state(model)
    with torch.no_grad():
        model.layer.lin.weight[0, 0] = float("nan")  # the fixed-point solve produces NaN
    before = _state(model)
    guard, rows = _guard(model, policy)
    assert guard(*_batch(), step=2) is None
    assert (rows[0]["kind"], rows[0]["layer"], rows[0]["action"]) == (
        "forward_nonfinite",
        "layer",
        "skipped",
    )
    for key, value in model.state_dict().items():
        torch.testing.assert_close(value, before[key], rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("policy", ["skip_batch", "fallback"])
def test_non_finite_input_is_skipped_before_the_forward(policy: str) -> None:
    model = Model(EXACT, ih.OneStep())
    before = _state(model)
    guard, rows = _guard(model, policy)
    x, y = _batch()
    x[0, 0] = float("nan")
    calls = []
    model.register_forward_pre_hook(lambda *_: calls.append(1))
    assert guard(x, y, step=2) is None
    assert not calls  # the model never saw the NaN
    assert (rows[0]["kind"], rows[0]["layer"], rows[0]["action"]) == (
        "input_nonfinite",
        "(inputs)",
        "skipped",
    )
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key
    guard, _ = _guard(Model(EXACT, ih.OneStep()), "warn")
    with pytest.raises(ih.NonFiniteError, match="input nonfinite"):
        guard(x, y, step=0)


def test_non_finite_batchnorm_buffer_is_caught_and_restored() -> None:
    # float32 batch variance of +-1e30 overflows to inf in the running variance
    model = nn.Sequential(nn.BatchNorm1d(WIDTH), nn.Linear(WIDTH, CLASSES))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    guard, rows = _guard(model, "skip_batch")
    x = torch.full((4, WIDTH), 1e30) * torch.tensor([[1.0], [-1.0], [1.0], [-1.0]])
    y = torch.zeros(4, dtype=torch.long)
    assert torch.isfinite(x).all()
    assert guard(x, y, step=0) is None
    assert (rows[0]["kind"], rows[0]["layer"]) == ("buffer_nonfinite", "0.running_var")
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key  # the statistics are restored
    guard, _ = _guard(model, "warn")
    with pytest.raises(ih.NonFiniteError, match="buffer nonfinite"):
        guard(x, y, step=0)


def test_non_finite_forward_raises_under_raise() -> None:
    x, y = _batch()
    x[0, 0] = float("inf")
    guard, _ = _guard(Model(EXACT, ih.OneStep()), "raise")
    with pytest.raises(ih.NonFiniteError):
        guard(x, y, step=0)


def test_non_finite_loss_and_gradient_are_caught() -> None:
    model = Model(EXACT, ih.OneStep())
    with torch.no_grad():
        model.out.bias[0] = float("nan")
    guard, rows = _guard(model, "skip_batch")
    assert guard(*_batch(), step=0) is None
    assert rows[0]["kind"] == "loss_nonfinite"
    guard, rows = _guard(Model(EXACT, ih.OneStep(), nan_grad=True), "fallback")
    assert guard(*_batch(), step=0) is None
    assert (rows[0]["kind"], rows[0]["layer"]) == ("grad_nonfinite", "(parameters)")
    guard, _ = _guard(Model(EXACT, ih.OneStep(), nan_grad=True), "warn")
    with pytest.raises(ih.NonFiniteError, match="grad nonfinite"):
        guard(*_batch(), step=0)


def test_monitor_state_round_trip_and_merge() -> None:
    guard, _ = _guard(Model(MISS, ih.OneStep()), "warn")
    for step in range(3):
        guard(*_batch(), step=step)
    restored = FailureMonitor()
    restored.load_state_dict(guard.monitor.state_dict())
    assert restored.summary() == guard.monitor.summary()
    restored.merge([guard.monitor.state_dict()])
    assert restored.summary()["by_layer"] == {"layer": {"forward_not_converged": 6}}


def test_unknown_policy_lists_the_choices() -> None:
    with pytest.raises(ValueError, match="skip_batch"):
        _guard(Model(EXACT, ih.OneStep()), "ignore")


TRUNCATED = ih.FixedPointIteration(max_steps=2)  # no tolerance: the forward never "fails"


@pytest.mark.parametrize("adjoint", [ih.Implicit(linear_solver="dense"), ih.Neumann(k=3)])
def test_a_truncated_forward_is_counted_per_layer_as_not_a_fixed_point(adjoint) -> None:
    """Two steps of z = tanh(0.5 W z + x) from 0 are not a fixed point: the at-fixed-point
    modes flag every backward, the monitor counts them per layer and rate-limits its warnings
    (the library's own warnings are replaced, not repeated)."""
    model = Model(TRUNCATED, adjoint)
    guard, rows = _guard(model, "warn", warn_first=1, warn_every=100)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(3):
            guard(*_batch(), step=step)
    assert not [w for w in caught if issubclass(w.category, ih.ConvergenceWarning)]
    summary = guard.monitor.summary()
    assert summary["by_layer"] == {"layer": {"backward_not_fixed_point": 3}}
    residuals = [r["residual"] for r in rows]
    assert all(r > 1e-3 for r in residuals), residuals
    stats = model.layer.last_solution.backward_stats
    assert stats.at_fixed_point is False and stats.forward_residual == residuals[-1]


def test_fallback_at_a_point_that_is_not_a_fixed_point_uses_the_one_step_gradient() -> None:
    """Under on_failure=fallback the adjoint gets on_divergence='fallback': the gradient is that
    of f(z_K, x) at the detached two-step iterate z_K (computed by hand here)."""
    model = Model(TRUNCATED, ih.Implicit(linear_solver="dense"))
    x, y = _batch()
    expected = _fallback_reference(model, x, y, steps=2)
    guard, rows = _guard(model, "fallback")
    guard(x, y, step=0)
    _assert_parameters(model, expected)
    assert [(r["kind"], r["action"]) for r in rows] == [("backward_not_fixed_point", "fallback")]
