"""TorchDEQ training steps and their translations here, side by side
(docs/migrating_from_torchdeq.md).

The DEQ ``z = tanh(W z + U x)`` in float64 with a linear head and cross-entropy, built twice with
the same weights: once through ``torchdeq.get_deq(...)`` (plain keyword arguments, never an
OmegaConf config), once through ``ih.fixed_point``. Every case runs the same number of forward
steps in both libraries (TorchDEQ's ``f_tol=0`` never stops early; ``FixedPointIteration`` without
a tolerance runs its budget), then compares the loss, the states and every parameter's gradient
(and, for the IFT step, the parameters after one SGD step).

Why the tolerances are what they are:

* IFT: TorchDEQ's output is ``f(z_K')`` (its IFT takes one more step of f, with gradient, from the
  solver's result z_K'), so ``f_max_iter = K - 1`` there gives the same value as ``K`` steps here
  (1e-14 absolute: the same float operations). Its ``df/dθ`` is evaluated at ``z_{K-1}`` and ours
  at ``z_K``: the gradients differ by O(||z_K - z_{K-1}||), asserted below 1e-11, and by the two
  backward solves' tolerances (1e-13), each amplified by at most ``1 / (1 - ||W||_2) = 2``:
  rtol 1e-10 (measured: 2e-14, the iteration reaches machine precision within the budget). Weight
  normalisation is checked the same way.
* PhantomGrad states: TorchDEQ's state k is ``z_{i_k}`` moved by the ``grad`` damped steps; ours
  keeps ``z_{i_k}`` (a backward mode never changes a value here) and carries the same steps'
  gradient. With a loss linear in the state the gradients are identical (1e-13) and TorchDEQ's
  values are ours moved by the damped steps (1e-14). With cross-entropy they agree where the
  states have converged (the damped steps then move nothing): 1e-10.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

import implicit_ham as ih

torchdeq = pytest.importorskip("torchdeq")
from torchdeq.loss import fp_correction, jac_reg  # noqa: E402
from torchdeq.norm import apply_norm as torchdeq_apply_norm  # noqa: E402
from torchdeq.norm import reset_norm  # noqa: E402

F64 = torch.float64
B, D, N_IN, CLASSES = 8, 6, 5, 3


class Cell(nn.Module):
    """``f(z, x) = tanh(W z + U x)`` with ``||W||_2 = scale``, and a linear head."""

    def __init__(self, scale: float, seed: int = 0) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        w = torch.randn(D, D, generator=gen, dtype=F64)
        self.W = nn.Linear(D, D, bias=False, dtype=F64)
        self.U = nn.Linear(N_IN, D, dtype=F64)
        self.head = nn.Linear(D, CLASSES, dtype=F64)
        with torch.no_grad():
            self.W.weight.copy_(scale * w / torch.linalg.matrix_norm(w, ord=2))
            for p in (self.U.weight, self.U.bias, self.head.weight, self.head.bias):
                p.copy_(torch.randn(p.shape, generator=gen, dtype=F64) / N_IN**0.5)

    def forward(self, z: Tensor, x: Tensor) -> Tensor:
        return torch.tanh(self.W(z) + self.U(x))


def data() -> tuple[Tensor, Tensor, Tensor]:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(B, N_IN, generator=gen, dtype=F64)
    y = torch.randint(0, CLASSES, (B,), generator=gen)
    c = torch.randn(B, D, generator=gen, dtype=F64)  # a loss linear in the state: sum(c * z)
    return x, y, c


def tensor(value: object) -> Tensor:
    """A solution or state of a Tensor-state solve, typed as a Tensor."""
    assert isinstance(value, Tensor)
    return value


def grads(module: nn.Module) -> dict[str, Tensor]:
    return {n: torch.zeros_like(p) if p.grad is None else p.grad.clone()
            for n, p in module.named_parameters()}  # fmt: skip


def assert_same_grads(theirs: nn.Module, ours: nn.Module, rtol: float, atol: float) -> None:
    mine = grads(ours)
    for name, grad in grads(theirs).items():
        torch.testing.assert_close(mine[name], grad, rtol=rtol, atol=atol, msg=name)


def test_an_ift_training_step_translates_to_implicit() -> None:
    """get_deq(ift=True, fixed_point_iter both ways) == FixedPointIteration + Implicit."""
    x, y, _ = data()
    K = 40
    theirs, ours = Cell(0.5), Cell(0.5)
    deq = torchdeq.get_deq(
        f_solver="fixed_point_iter", f_max_iter=K - 1, f_tol=0.0,
        b_solver="fixed_point_iter", b_max_iter=300, b_tol=1e-13, ift=True,
    )  # fmt: skip
    calls = {"theirs": 0, "ours": 0}

    def count(name: str) -> None:
        calls[name] += 1

    ours.register_forward_hook(lambda *_: count("ours"))
    theirs.register_forward_hook(lambda *_: count("theirs"))
    z_out, _ = deq(lambda z: theirs(z, x), torch.zeros(B, D, dtype=F64))
    loss_t = F.cross_entropy(theirs.head(z_out[-1]), y)
    loss_t.backward()
    torch.optim.SGD(theirs.parameters(), lr=0.1).step()

    solver = ih.FixedPointIteration(max_steps=K)
    adjoint = ih.Implicit(linear_solver="fixed_point", max_steps=300, tol=1e-13)
    sol = ih.fixed_point(ours, torch.zeros(B, D, dtype=F64), x, solver=solver, adjoint=adjoint)
    assert calls == {"theirs": K - 1 + 1 + 1, "ours": K + 1}  # solve + IFT step + backward's f
    loss_o = F.cross_entropy(ours.head(sol.value), y)
    loss_o.backward()

    assert sol.stats.steps == K
    assert float(sol.stats.abs_residual.max()) < 1e-11  # ||z_K - z_{K-1}||: see the docstring
    torch.testing.assert_close(sol.value, z_out[-1], rtol=0, atol=1e-14)
    assert float(loss_o.detach()) == pytest.approx(float(loss_t.detach()), rel=1e-13)
    assert_same_grads(theirs, ours, rtol=1e-10, atol=1e-13)
    assert sol.backward_stats is not None and sol.backward_stats.converged
    torch.optim.SGD(ours.parameters(), lr=0.1).step()
    for (name, p), q in zip(theirs.named_parameters(), ours.parameters(), strict=True):
        torch.testing.assert_close(q, p, rtol=1e-11, atol=1e-13, msg=name)


@pytest.mark.parametrize(
    ("selection", "states"), [({"n_states": 3}, 3), ({"indexing": [3, 7]}, [3, 7, 12])]
)
def test_phantom_states_carry_torchdeqs_gradient_and_keep_the_iterates_value(
    selection: dict, states: int | list[int]
) -> None:
    """get_deq(core="indexing", grad=k, tau, n_states / indexing) + fp_correction ==
    Phantom(k, tau) + fixed_point(..., states=) + fixed_point_correction, on a linear loss."""
    x, _, c = data()
    K, k, tau = 12, 3, 0.5
    theirs, ours = Cell(0.5), Cell(0.5)
    deq = torchdeq.get_deq(core="indexing", f_solver="fixed_point_iter", f_max_iter=K,
                           f_tol=0.0, grad=k, tau=tau, **selection)  # fmt: skip
    z_out, _ = deq(lambda z: theirs(z, x), torch.zeros(B, D, dtype=F64))
    fp_correction(lambda z: (c * z).sum(), (z_out,), weight_func="exp").backward()

    sol = ih.fixed_point(
        ours,
        torch.zeros(B, D, dtype=F64),
        x,
        states=states,
        solver=ih.FixedPointIteration(max_steps=K),
        adjoint=ih.Phantom(k, tau),
    )
    ih.fixed_point_correction(lambda z: (c * z).sum(), sol.states, "exp").backward()

    assert len(sol.states) == len(z_out) == 3
    assert torch.equal(tensor(sol.states[-1]), tensor(sol.value))
    for theirs_state, state in zip(z_out, sol.states, strict=True):
        moved = tensor(state).detach()
        for _ in range(k):  # TorchDEQ's value: the damped steps applied to our state
            moved = tau * ours(moved, x) + (1 - tau) * moved
        torch.testing.assert_close(theirs_state.detach(), moved, rtol=0, atol=1e-14)
    assert float((z_out[0] - tensor(sol.states[0])).detach().abs().max()) > 1e-4  # they differ
    assert_same_grads(theirs, ours, rtol=1e-13, atol=1e-14)


@pytest.mark.parametrize(
    ("torchdeq_grad", "adjoint", "states"),
    [({"grad": 3, "tau": 0.5}, ih.Phantom(3, 0.5), 3),
     ({"ift": True, "b_solver": "fixed_point_iter", "b_max_iter": 300, "b_tol": 1e-13},
      ih.Implicit(linear_solver="fixed_point", max_steps=300, tol=1e-13), [20, 40])],
    ids=["phantom", "ift"],
)  # fmt: skip
def test_a_correction_training_step_on_converged_states_matches(
    torchdeq_grad: dict, adjoint: ih.plugins.Adjoint, states: int | list[int]
) -> None:
    """Cross-entropy over three states (20, 40, 60 evaluations): PhantomGrad on every state, or
    IFT on the last one and one-step gradients on the others (TorchDEQ's ``ift`` with
    ``n_states``; here the states before the last and ``sol.value``, which carries Implicit)."""
    x, y, _ = data()
    K = 60
    theirs, ours = Cell(0.3), Cell(0.3)
    deq = torchdeq.get_deq(core="indexing", f_solver="fixed_point_iter", f_max_iter=K,
                           f_tol=0.0, n_states=3, **torchdeq_grad)  # fmt: skip
    z_out, _ = deq(lambda z: theirs(z, x), torch.zeros(B, D, dtype=F64))
    loss_t = fp_correction(lambda z: F.cross_entropy(theirs.head(z), y), (z_out,), "exp")
    loss_t.backward()

    sol = ih.fixed_point(
        ours,
        torch.zeros(B, D, dtype=F64),
        x,
        states=states,
        solver=ih.FixedPointIteration(max_steps=K),
        adjoint=adjoint,
    )
    kept = sol.states if isinstance(states, int) else [*sol.states, sol.value]
    loss_o = ih.fixed_point_correction(lambda z: F.cross_entropy(ours.head(z), y), kept, "exp")
    loss_o.backward()

    assert float(loss_o.detach()) == pytest.approx(float(loss_t.detach()), rel=1e-12)
    for theirs_state, state in zip(z_out, kept, strict=True):
        torch.testing.assert_close(state, theirs_state, rtol=0, atol=1e-12)
    assert_same_grads(theirs, ours, rtol=1e-10, atol=1e-13)


def test_weight_norm_translates_and_needs_no_reset() -> None:
    """torchdeq.norm.apply_norm(cell, "weight_norm") + reset_norm before each step ==
    ih.nn.apply_norm(cell, "weight") (torch's weight_norm, computed once per solve)."""
    x, y, _ = data()
    theirs, ours = Cell(0.5), Cell(0.5)
    torchdeq_apply_norm(theirs, "weight_norm", filter_out=["head", "U"])
    assert ih.nn.apply_norm(ours, "weight", exclude=["head", "U"]) == ["W"]
    reset_norm(theirs)
    deq = torchdeq.get_deq(f_solver="fixed_point_iter", f_max_iter=29, f_tol=0.0, ift=True,
                           b_solver="fixed_point_iter", b_max_iter=300, b_tol=1e-13)  # fmt: skip
    z_out, _ = deq(lambda z: theirs(z, x), torch.zeros(B, D, dtype=F64))
    F.cross_entropy(theirs.head(z_out[-1]), y).backward()
    sol = ih.fixed_point(ours, torch.zeros(B, D, dtype=F64), x,
                         solver=ih.FixedPointIteration(max_steps=30),
                         adjoint=ih.Implicit(linear_solver="fixed_point", max_steps=300,
                                             tol=1e-13))  # fmt: skip
    F.cross_entropy(ours.head(sol.value), y).backward()
    assert float(sol.stats.abs_residual.max()) < 1e-11
    torch.testing.assert_close(sol.value, z_out[-1], rtol=0, atol=1e-14)
    mine, peer = dict(ours.W.named_parameters()), dict(theirs.W.named_parameters())
    for torch_name, torchdeq_name in (("original0", "weight_g"), ("original1", "weight_v")):
        torch.testing.assert_close(  # torch's (g, v) of w = g v / ||v||
            mine[f"parametrizations.weight.{torch_name}"].grad, peer[torchdeq_name].grad,
            rtol=1e-10, atol=1e-13,
        )  # fmt: skip


def test_jac_reg_and_jacobian_penalty_estimate_the_same_quantity() -> None:
    """Both are Hutchinson estimates of ||df/dz||_F^2 / numel(z) (TorchDEQ's normalisation):
    their means over many probes agree with the dense value within four standard errors."""
    x, _, _ = data()
    cell = Cell(0.9)
    sol = ih.fixed_point(cell, torch.zeros(B, D, dtype=F64), x,
                         solver=ih.FixedPointIteration(max_steps=200))  # fmt: skip
    z = tensor(sol.value).detach()
    dense = torch.autograd.functional.jacobian(lambda v: cell(v, x), z)  # (B, D, B, D)
    exact = float(dense.square().sum()) / z.numel()
    torch.manual_seed(0)
    z_req = z.clone().requires_grad_(True)
    f0 = cell(z_req, x)
    theirs = [float(jac_reg(f0, z_req, vecs=1, create_graph=False)) for _ in range(1500)]
    gen = torch.Generator().manual_seed(0)
    ours = [float(ih.jacobian_penalty(cell, z, x, generator=gen).detach()) for _ in range(1500)]
    for draws in (theirs, ours):
        values = torch.tensor(draws, dtype=F64)
        se = float(values.std()) / len(draws) ** 0.5
        assert abs(float(values.mean()) - exact) < 4 * se, (float(values.mean()), exact, se)
