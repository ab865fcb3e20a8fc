"""Gradient norms, layer gradient hooks and DiagnosticsCallback against direct computations."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from torch import nn

import implicit_ham as ih
from implicit_ham.diagnostics import (
    DiagnosticsCallback,
    LayerGradientHooks,
    find_implicit_layers,
    grad_norms,
)

F64 = torch.float64


class TinyDEQ(nn.Module):
    """z = tanh(W z + x): an implicit layer exposing adjoint, implicit_problem, last_solution."""

    def __init__(
        self, n: int, adjoint: ih.plugins.Adjoint | None = None, scale: float = 0.5
    ) -> None:
        super().__init__()
        self.lin = nn.Linear(n, n, dtype=F64)
        with torch.no_grad():
            self.lin.weight.mul_(scale)
        self.adjoint = adjoint or ih.Implicit()
        self.solver = ih.FixedPointIteration(max_steps=200, tol=1e-12)
        self.last_solution: ih.Solution | None = None

    def step(self, z: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.lin(z) + x)

    def implicit_problem(self, x: torch.Tensor, init: torch.Tensor | None = None):
        z0 = torch.zeros_like(x) if init is None else init
        return ih.FixedPointProblem(self.step, z0, (x,))

    def forward(self, x: torch.Tensor, init: torch.Tensor | None = None) -> torch.Tensor:
        self.last_solution = self.implicit_problem(x, init).solve(self.solver, self.adjoint)
        return self.last_solution.value


def _model(n: int = 4) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, n, dtype=F64), TinyDEQ(n), nn.Linear(n, 2, dtype=F64))


def _direct_norm(params) -> float:
    return math.sqrt(sum(float(p.grad.pow(2).sum()) for p in params if p.grad is not None))


def test_grad_norms_equal_direct_computation() -> None:
    model = _model()
    opt = torch.optim.SGD(
        [
            {"params": model[0].parameters(), "name": "encoder"},
            {"params": [*model[1].parameters(), *model[2].parameters()]},
        ],
        lr=0.1,
    )
    model(torch.randn(5, 3, dtype=F64)).pow(2).sum().backward()
    out = grad_norms(model, optimizer=opt)
    assert out["grad_norm/global"] == pytest.approx(_direct_norm(model.parameters()), rel=1e-12)
    for i in range(3):
        expected = _direct_norm(model[i].parameters())
        assert out[f"grad_norm/module/{i}"] == pytest.approx(expected, rel=1e-12)
    assert out["grad_norm/group/encoder"] == pytest.approx(_direct_norm(model[0].parameters()))
    rest = [*model[1].parameters(), *model[2].parameters()]
    assert out["grad_norm/group/1"] == pytest.approx(_direct_norm(rest), rel=1e-12)
    deeper = grad_norms(model, depth=2)
    assert deeper["grad_norm/module/1.lin"] == pytest.approx(_direct_norm(model[1].parameters()))


def test_layer_hooks_equal_gradients_at_the_layer_input_and_output() -> None:
    model = _model()
    layers = find_implicit_layers(model)
    assert list(layers) == ["1"]
    hooks = LayerGradientHooks(layers)
    hooks.attach()
    x = torch.randn(5, 3, dtype=F64)
    h = model[0](x)
    h.retain_grad()
    z = model[1](h)
    z.retain_grad()
    model[2](z).pow(2).sum().backward()
    got = hooks.pop()
    hooks.detach()
    assert got["grad_norm/layer/1/output"] == pytest.approx(float(z.grad.norm()), rel=1e-12)
    assert got["grad_norm/layer/1/input"] == pytest.approx(float(h.grad.norm()), rel=1e-12)
    assert hooks.pop() == {}
    model(x).sum().backward()  # detached: nothing is recorded any more
    assert hooks.pop() == {}


def _train(model: nn.Module, cb: DiagnosticsCallback, steps: int) -> list[float]:
    """A few SGD steps; returns the direct global gradient norm at each step."""
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(1)
    norms = []
    for step in range(steps):
        x = torch.randn(6, 3, dtype=F64, generator=gen)
        loss = model(x).pow(2).mean()
        loss.backward()
        norms.append(_direct_norm(model.parameters()))
        cb.on_backward(step)
        opt.step()
        opt.zero_grad()
        cb.on_step(step, {"loss": loss})
    return norms


class RowSink(ih.diagnostics.Sink):
    """Keeps every logged row (with its step), as a file sink would write them."""

    def __init__(self) -> None:
        self.rows: list[dict] = []

    def log(self, metrics, step) -> None:
        self.rows.append({"step": step, **metrics})

    def log_table(self, name, rows, step=None) -> None:
        self.rows += [{"table": name, "step": step, **row} for row in rows]


def test_callback_logs_every_n_steps_with_direct_values() -> None:
    model = _model()
    sink = RowSink()
    cb = DiagnosticsCallback(model, sink, every=2, conditioning_every=4)
    norms = _train(model, cb, steps=5)
    cb.close()
    rows = sink.rows
    diag = [r for r in rows if "grad_norm/global" in r]
    assert [r["step"] for r in diag] == [0, 2, 4]
    assert [r["step"] for r in rows if "loss" in r] == [0, 2, 4]
    for r in diag:
        assert r["grad_norm/global"] == pytest.approx(norms[r["step"]], rel=1e-12)
        assert r["grad_norm/layer/1/output"] > 0 and r["grad_norm/layer/1/input"] > 0
        assert r["solver/1/converged"] is True
        assert r["backward/1/rel_residual"] < 1e-5
    cond = [r for r in rows if "cond/1/spectral_radius" in r]
    assert [r["step"] for r in cond] == [0, 4]
    assert all(r["cond/1/fixed_point_residual"] < 1e-9 for r in cond)


def test_callback_conditioning_matches_dense_jacobian() -> None:
    model = _model()
    logged: list[dict] = []

    class ListSink(ih.diagnostics.Sink):
        def log(self, metrics, step):
            logged.append(dict(metrics, step=step))

        def log_table(self, name, rows, step=None):
            raise AssertionError("no tables expected")

    cb = DiagnosticsCallback(model, ListSink(), every=1, conditioning_every=1)
    x = torch.randn(1, 3, dtype=F64)
    h = model[0](x)
    z = model[1](h)
    model[2](z).sum().backward()
    z_star = model[1].last_solution.value.detach()
    cb.on_backward(0)
    deq = model[1]
    jac = torch.autograd.functional.jacobian(lambda v: deq.step(v, h.detach()), z_star)
    jac = jac.reshape(4, 4)
    rho = float(torch.linalg.eigvals(jac).abs().max())
    kappa = float(torch.linalg.cond(torch.eye(4, dtype=F64) - jac))
    assert logged[0]["cond/1/spectral_radius"] == pytest.approx(rho, rel=0.01)
    assert logged[0]["cond/1/kappa"] == pytest.approx(kappa, rel=0.1)


def test_hooks_are_attached_only_for_logged_steps() -> None:
    model = _model()
    cb = DiagnosticsCallback(model, JSONLSinkNull(), every=3)
    assert cb.hooks is not None and cb.hooks.attached  # step 0 is logged
    model(torch.randn(2, 3, dtype=F64)).sum().backward()
    cb.on_backward(0)
    assert not cb.hooks.attached  # step 1 is not
    cb.on_backward(1)
    assert not cb.hooks.attached  # step 2 is not
    cb.on_backward(2)
    assert cb.hooks.attached  # armed for step 3
    cb.close()
    assert not cb.hooks.attached


class JSONLSinkNull(ih.diagnostics.Sink):
    """A sink that drops everything."""

    def log(self, metrics, step) -> None:
        return None

    def log_table(self, name, rows, step=None) -> None:
        return None


def test_callback_conditioning_threshold_warns() -> None:
    torch.manual_seed(0)
    deq = TinyDEQ(3)
    with torch.no_grad():
        deq.lin.weight.copy_(torch.eye(3, dtype=F64) * 2.0)  # tanh'(0) * 2 = 2: J has eigenvalue 2
        deq.lin.bias.zero_()
    deq.solver = ih.FixedPointIteration(max_steps=1)
    cb = DiagnosticsCallback(
        deq, JSONLSinkNull(), every=1, conditioning_every=1, conditioning_threshold=0.5
    )
    deq(torch.zeros(1, 3, dtype=F64, requires_grad=True)).sum().backward()
    with pytest.warns(ih.ConditioningWarning, match="(root)"):
        cb.on_backward(0)


def test_callback_rejects_bad_frequency() -> None:
    with pytest.raises(ValueError, match="every must be an integer >= 1"):
        DiagnosticsCallback(_model(), JSONLSinkNull(), every=0)


def test_a_layer_fed_with_data_is_watched_without_pytorch_s_backward_hook_warning() -> None:
    """The implicit layer first, on data that needs no gradient: PyTorch's full backward hook
    warned "Full backward hook is firing when gradients are computed with respect to module
    outputs since no inputs require gradients"; the tensor hooks do not, and the output norm
    is the direct one (no input norm: the input has no gradient)."""
    torch.manual_seed(0)
    model = nn.Sequential(TinyDEQ(3), nn.Linear(3, 2, dtype=F64))
    sink = RowSink()
    cb = DiagnosticsCallback(model, sink, every=1)
    x = torch.randn(5, 3, dtype=F64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning fails the test
        z = model[0](x)
        z.retain_grad()
        model[1](z).pow(2).sum().backward()
        cb.on_backward(0)
    cb.close()
    (row,) = sink.rows
    assert row["grad_norm/layer/0/output"] == pytest.approx(float(z.grad.norm()), rel=1e-12)
    assert "grad_norm/layer/0/input" not in row
    assert row["solver/0/converged"] is True


def test_a_layer_called_twice_reports_both_calls_and_only_its_own_input_gradient() -> None:
    torch.manual_seed(0)
    deq, head = TinyDEQ(3), nn.Linear(3, 3, dtype=F64)
    hooks = LayerGradientHooks({"deq": deq})
    hooks.attach()
    h = head(torch.randn(4, 3, dtype=F64))
    h.retain_grad()
    first, second = deq(h), deq(2 * h)
    (first.sum() + second.pow(2).sum() + h.pow(3).sum()).backward()  # h is used outside too
    got = hooks.pop()
    hooks.detach()
    # the input gradients through deq alone: d/dh of the two calls' losses, by autograd
    hh = h.detach().requires_grad_()
    g1 = torch.autograd.grad(deq(hh).sum(), hh)[0]
    hh2 = (2 * h).detach().requires_grad_()
    g2 = torch.autograd.grad(deq(hh2).pow(2).sum(), hh2)[0]
    expected_input = math.sqrt(float(g1.square().sum() + g2.square().sum()))
    expected_output = math.sqrt(first.numel() + float((2 * second.detach()).square().sum()))
    assert got["grad_norm/layer/deq/input"] == pytest.approx(expected_input, rel=1e-10)
    assert got["grad_norm/layer/deq/output"] == pytest.approx(expected_output, rel=1e-10)


def test_the_implicit_layer_protocol_names_what_the_callback_reads() -> None:
    assert isinstance(TinyDEQ(3), ih.diagnostics.ImplicitLayer)
    assert isinstance(ih.NMF(rank=2), ih.diagnostics.ImplicitLayer)
    assert not isinstance(nn.Linear(2, 2), ih.diagnostics.ImplicitLayer)
