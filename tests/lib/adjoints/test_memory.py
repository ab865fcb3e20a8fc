"""Memory kept for backward, measured as the bytes autograd saves (saved_tensors_hooks).

Every tensor autograd saves passes through the pack hook; a storage shared by several saved
tensors (a step's output saved by tanh and again as the next matmul's input) is counted once.
"""

from __future__ import annotations

import pytest
from torch import Tensor
from torch.autograd.graph import saved_tensors_hooks

import implicit_ham as ih


def saved_bytes(problem, max_steps: int, adjoint: ih.plugins.Adjoint) -> int:
    """Bytes of the distinct storages autograd saves while building ``fixed_point``'s graph."""
    storages: dict[int, int] = {}
    keep_alive: list[Tensor] = []

    def pack(t: Tensor) -> Tensor:
        storage = t.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        keep_alive.append(t)
        return t

    solver = ih.FixedPointIteration(max_steps=max_steps)
    with saved_tensors_hooks(pack, lambda t: t):
        sol = ih.fixed_point(problem.f, problem.z0, *problem.args, solver=solver, adjoint=adjoint)
    assert sol.value.requires_grad
    return sum(storages.values())


@pytest.mark.parametrize(
    "adjoint",
    [ih.OneStep(), ih.Implicit(), ih.Neumann(k=8)],
    ids=["one_step", "implicit", "neumann"],
)
def test_at_fixed_point_and_one_step_memory_is_flat_in_steps(tanh_problem, adjoint) -> None:
    problem = tanh_problem(batch=64, width=16)
    one, many = saved_bytes(problem, 1, adjoint), saved_bytes(problem, 64, adjoint)
    assert one > 0
    assert abs(many - one) <= 0.1 * one, (one, many)


def test_unroll_memory_grows_linearly_in_steps(tanh_problem) -> None:
    problem = tanh_problem(batch=64, width=16)
    b8, b16, b64 = (saved_bytes(problem, k, ih.Unroll()) for k in (8, 16, 64))
    assert 0.85 * 8 <= b64 / b8 <= 1.1 * 8, (b8, b64)
    # exactly affine: every step adds the same bytes
    assert b64 - b8 == 7 * (b16 - b8), (b8, b16, b64)


def test_truncated_memory_depends_on_k_not_on_max_steps(tanh_problem) -> None:
    problem = tanh_problem(batch=64, width=16)
    short, long_ = (saved_bytes(problem, steps, ih.Truncated(4)) for steps in (8, 64))
    assert short == long_
    assert saved_bytes(problem, 8, ih.Truncated(4)) < saved_bytes(problem, 8, ih.Unroll())
