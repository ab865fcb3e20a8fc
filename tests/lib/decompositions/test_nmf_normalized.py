"""``NormalizedNMF``: NMF's output from unit-norm bases, and what that does to I - J."""

from __future__ import annotations

import pytest
import torch

import implicit_ham as ih

DT = torch.float64


def _output(name: str, x: torch.Tensor, steps: int, eps: float) -> torch.Tensor:
    layer = ih.make_decomposition(name, rank=3, steps=steps, eps=eps, adjoint=ih.Unroll()).double()
    torch.manual_seed(7)  # the same random initial bases for both layers
    return layer(x)


@pytest.mark.parametrize("steps", [1, 6, 40])
@pytest.mark.parametrize(("eps", "rtol"), [(1e-14, 1e-9), (1e-6, 1e-4)])
def test_output_equals_nmf_output(steps: int, eps: float, rtol: float) -> None:
    """Exactly NMF's output but for the ``eps`` of the divisions, which is not scale-invariant."""
    x = torch.rand(2, 8, 4, 5, dtype=DT)
    got, expected = _output("nmf_normalized", x, steps, eps), _output("nmf", x, steps, eps)
    torch.testing.assert_close(got, expected, rtol=rtol, atol=rtol * 1e-3)


def test_every_iterate_has_unit_norm_bases_and_the_same_product() -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(2, 6, 10, dtype=DT, generator=gen)
    bases = torch.rand(2, 6, 3, dtype=DT, generator=gen)
    coef = torch.rand(2, 10, 3, dtype=DT, generator=gen)
    plain, normal = ih.NMF(rank=3), ih.NormalizedNMF(rank=3)
    d, c = normal.step(x, (bases, coef))
    d_ref, c_ref = plain.step(x, (bases, coef))
    torch.testing.assert_close(d.norm(dim=1), torch.ones(2, 3, dtype=DT))
    torch.testing.assert_close(d @ c.mT, d_ref @ c_ref.mT)


def test_gradient_matches_finite_differences() -> None:
    layer = ih.NormalizedNMF(rank=2, steps=4, adjoint=ih.Unroll()).double()
    x = torch.rand(1, 4, 3, 3, dtype=DT, requires_grad=True)
    init = torch.nn.functional.normalize(torch.rand(1, 4, 2, dtype=DT), dim=1)
    assert torch.autograd.gradcheck(lambda x_: layer(x_, init=init), (x,))


def _unit_eigenvalues(layer: ih.Decomposition, x: torch.Tensor, init: torch.Tensor) -> int:
    """How many eigenvalues of the iteration's dense Jacobian at a converged solution are 1."""
    problem = layer.implicit_problem(x, init=init)
    with torch.no_grad():
        state = problem.solve(ih.FixedPointIteration(max_steps=5000)).value
    shapes = [t.shape for t in state]
    sizes = [t.numel() for t in state]

    def flat_map(vec: torch.Tensor) -> torch.Tensor:
        parts = tuple(p.reshape(s) for p, s in zip(vec.split(sizes), shapes, strict=True))
        return torch.cat([t.reshape(-1) for t in problem.f(parts, *problem.args)])

    jac = torch.autograd.functional.jacobian(flat_map, torch.cat([t.reshape(-1) for t in state]))
    return int(((torch.linalg.eigvals(jac) - 1).abs() < 1e-4).sum())


def test_removes_only_the_scaling_part_of_the_symmetry() -> None:
    """What the study reports: at a converged interior solution NMF's J has r^2 = 4 eigenvalues
    at 1 (the GL(r) family (D M, C M^-1) of equally good factorisations); unit-norm bases remove
    the r = 2 scalings and leave r^2 - r = 2, so I - J stays singular."""
    gen = torch.Generator().manual_seed(2)
    x = torch.rand(1, 8, 3, 4, dtype=DT, generator=gen) + 0.5
    init = torch.nn.functional.normalize(torch.rand(1, 8, 2, dtype=DT, generator=gen), dim=1)
    assert _unit_eigenvalues(ih.NMF(rank=2).double(), x, init) == 4
    assert _unit_eigenvalues(ih.NormalizedNMF(rank=2).double(), x, init) == 2
