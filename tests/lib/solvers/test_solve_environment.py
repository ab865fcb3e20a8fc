"""What a fixed-point solve reads of its calling context once per solve (``_environment``:
whether a step can record a gradient, whether host-side checks may run, whether the stats are
computed at once) agrees with the library's separate readers of the same facts in every context
a solve meets: eager with and without grad, forward-mode AD, torch.func's grad, vmap and jvp.
The one-tensor fast path of ``StateSpec.of`` gives the general path's spec and errors."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.autograd import forward_ad

import implicit_ham as ih
from implicit_ham._core.state import StateSpec
from implicit_ham._core.transforms import active_transforms, host_checks
from implicit_ham.solvers.iteration import _environment

DT = torch.float64


def separate_readers() -> tuple[bool, bool, bool]:
    """The three facts read the way the library read them before ``_environment``."""
    recording = (
        torch.is_grad_enabled() or bool(active_transforms()) or bool(forward_ad._current_level >= 0)
    )
    now = torch.compiler.is_compiling() or bool(active_transforms())
    return recording, host_checks(), now


def in_every_context(probe):
    """``probe()`` (returning a tuple of bools) evaluated in each context, by name."""
    x = torch.ones(3, dtype=DT)
    seen: dict[str, tuple[bool, ...]] = {}

    def under(name: str):
        def record(t: torch.Tensor) -> torch.Tensor:
            seen[name] = probe()
            return t.sum()

        return record

    seen["eager"] = probe()
    with torch.no_grad():
        seen["no_grad"] = probe()
    with torch.no_grad(), forward_ad.dual_level():
        seen["forward_ad"] = probe()
    torch.func.grad(under("grad"))(x)
    torch.func.vmap(under("vmap"))(x[:, None])
    torch.func.jvp(under("jvp"), (x,), (x,))
    return seen


def test_environment_matches_the_separate_readers_in_every_context() -> None:
    got = in_every_context(_environment)
    expected = in_every_context(separate_readers)
    assert got == expected
    # the facts themselves, so that the comparison is not vacuous
    assert got["eager"] == (True, True, False)
    assert got["no_grad"] == (False, True, False)
    assert got["forward_ad"] == (True, True, False)
    assert got["grad"][0] and got["grad"][1] and got["grad"][2]
    assert got["vmap"][1] is False and got["vmap"][2] is True


def test_a_tolerance_solve_under_vmap_is_still_refused() -> None:
    z0 = torch.zeros(2, 4, 3, dtype=DT)
    solver = ih.FixedPointIteration(max_steps=5, tol=1e-6)

    def solve(z: torch.Tensor) -> torch.Tensor:
        return ih.fixed_point(lambda u: 0.5 * u + 1, z, solver=solver).value

    with pytest.raises(NotImplementedError, match=r"under torch\.func\.vmap"):
        torch.func.vmap(solve)(z0)


def test_stats_under_a_transform_are_computed_at_once_and_eager_ones_on_read() -> None:
    solver = ih.FixedPointIteration(max_steps=4)
    z0 = torch.zeros(2, 3, dtype=DT)
    stats = ih.fixed_point(lambda u: 0.5 * u + 1, z0, solver=solver).stats
    assert stats._values is None  # deferred: nothing computed yet
    kept = {}

    def solve(x: torch.Tensor) -> torch.Tensor:
        result = ih.fixed_point(lambda u, a: 0.5 * u + a, z0, x, solver=solver)
        kept["stats"] = result.stats
        return result.value.sum()

    torch.func.grad(solve)(torch.ones(2, 3, dtype=DT))
    assert kept["stats"]._values is not None  # computed inside the transform
    # the deferred ones, read now: z_k = 2 (1 - 0.5^k) per entry, so the last step's change
    # is 2 * 0.5^4 in each of the 3 entries of a sample
    expected = torch.full((2,), 2 * 0.5**4 * 3**0.5, dtype=DT)
    torch.testing.assert_close(stats.abs_residual, expected, rtol=1e-15, atol=0)


@pytest.mark.parametrize(
    "z0",
    [
        torch.zeros(4, 3),
        torch.zeros(2, 5, 7, dtype=DT),
        nn.Parameter(torch.zeros(4, 3)),  # a subclass: the general path
    ],
    ids=["float32", "float64-3d", "parameter"],
)
def test_one_tensor_spec_fast_path_equals_the_general_path(z0: torch.Tensor) -> None:
    fast = StateSpec.of(z0)
    general = StateSpec.of((z0,))
    assert fast == StateSpec(general.shapes, general.dtype, False)
    assert fast.batch == z0.shape[0]


@pytest.mark.parametrize(
    ("z0", "error", "match"),
    [
        (torch.tensor(1.0), ValueError, "scalar"),
        (torch.zeros(3, 2, dtype=torch.int64), TypeError, "floating dtype"),
    ],
)
def test_one_tensor_spec_errors_are_the_general_paths(z0, error, match) -> None:
    with pytest.raises(error, match=match):
        StateSpec.of(z0)
