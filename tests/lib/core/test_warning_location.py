"""Every warning of the library points at the user's line (``_core.caller.user_stacklevel``):
the call that solved, or the ``backward()`` that differentiated, however deep the library's
own call chain was (the newcomer trial found them attributed to internal lines)."""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

import implicit_ham as ih
from implicit_ham._core.caller import user_stacklevel

SOURCE = Path(__file__).read_text().splitlines()


def _line(marker: str) -> int:
    """The number of this file's line that ends with the comment ``# <marker>``."""
    (number,) = [i for i, text in enumerate(SOURCE, 1) if text.endswith(f"# <{marker}>")]
    return number


def _lines(category: type[Warning], records: list[warnings.WarningMessage]) -> list[int]:
    """The lines of this file the warnings of ``category`` point at."""
    mine = [w for w in records if issubclass(w.category, category) and w.filename == __file__]
    return [w.lineno for w in mine]


def test_forward_and_backward_warnings_point_at_the_users_lines() -> None:
    weight = torch.randn(16, 16, generator=torch.Generator().manual_seed(0)) * 0.3
    x = torch.randn(8, 16, requires_grad=True)
    f = lambda z, x: torch.tanh(z @ weight.T + x)  # noqa: E731
    few = ih.FixedPointIteration(max_steps=2, tol=1e-12)  # too few steps: both warnings
    with warnings.catch_warnings(record=True) as records:
        warnings.simplefilter("always")
        sol = ih.fixed_point(f, torch.zeros(8, 16), x, solver=few, adjoint="implicit")  # <solve>
        sol.value.sum().backward()  # <backward>
    # the forward solve misses its tolerance; the backward pass is taken off a fixed point
    # (and its linear solve may miss its own tolerance): each at the user's line that ran it
    assert _lines(ih.ConvergenceWarning, records)[0] == _line("solve")
    assert _lines(ih.NotFixedPointWarning, records) == [_line("backward")]
    assert {w.filename for w in records} == {__file__}
    assert set(_lines(Warning, records)) == {_line("solve"), _line("backward")}


def test_a_minimizer_warning_points_at_the_call() -> None:
    a = torch.randn(6, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    z0 = torch.ones(1, 4, dtype=torch.float64)
    with warnings.catch_warnings(record=True) as records, torch.no_grad():
        warnings.simplefilter("always")
        ih.minimize(lambda z: 0.5 * (z @ a.T - 1).square().sum(), z0, solver="lbfgs")  # <min>
        ih.minimize(lambda z: (z @ a.T).square().sum(), z0, solver=ih.LBFGS(max_steps=1))  # <1>
    assert _lines(ih.ConvergenceWarning, records) == [_line("1")]


def test_user_stacklevel_counts_only_library_and_torch_frames() -> None:
    assert user_stacklevel() == 1  # called from this file: the caller's own line
    with warnings.catch_warnings(record=True) as records:
        warnings.simplefilter("always")
        warnings.warn("here", UserWarning, stacklevel=user_stacklevel())  # <direct>
    assert [w.lineno for w in records] == [_line("direct")]
