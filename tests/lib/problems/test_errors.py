"""Bad input fails loudly, with a message that names the problem (and the valid choices)."""

from __future__ import annotations

import sys

import pytest
import torch
from torch import Tensor

import implicit_ham as ih

DT = torch.float64


def halve(z: Tensor) -> Tensor:
    return 0.5 * z


# --- unknown names and options ------------------------------------------------------------------


def test_unknown_solver_name_lists_the_valid_solvers() -> None:
    with pytest.raises(KeyError, match=r"unknown solver 'nope'; valid choices: .*fixed_point"):
        ih.fixed_point(halve, torch.ones(2, 3, dtype=DT), solver="nope")


def test_unknown_adjoint_name_lists_the_valid_adjoints() -> None:
    with pytest.raises(KeyError, match="unknown adjoint 'nope'") as info:
        ih.plugins.make_adjoint("nope")
    for name in ("implicit", "neumann", "one_step", "phantom", "truncated", "unroll"):
        assert name in str(info.value)


def test_unknown_adjoint_name_in_fixed_point() -> None:
    with pytest.raises(KeyError, match="unknown adjoint 'nope'; valid choices: implicit"):
        ih.fixed_point(halve, torch.ones(2, 3, dtype=DT), adjoint="nope")


def test_unknown_linear_solver_name_lists_the_valid_linear_solvers() -> None:
    with pytest.raises(KeyError, match="unknown linear solver 'nope'") as info:
        ih.Implicit(linear_solver="nope")
    for name in ("anderson", "broyden", "dense", "fixed_point", "gmres"):
        assert name in str(info.value)


@pytest.mark.parametrize(
    ("make", "name", "bad_key"),
    [
        (ih.plugins.make_adjoint, "truncated", "kk"),
        (ih.plugins.make_adjoint, "implicit", "linear_sovler"),
        (ih.plugins.make_solver, "anderson", "mm"),
        (ih.plugins.make_linear_solver, "gmres", "restarts"),
    ],
)
def test_unknown_option_key_is_rejected_with_the_valid_options(make, name, bad_key) -> None:
    with pytest.raises(TypeError, match=rf"unknown option\(s\) {bad_key} for .* '{name}'"):
        make(name, **{bad_key: 2})


def test_unknown_option_message_lists_the_valid_options() -> None:
    with pytest.raises(TypeError, match=r"valid options: k$"):
        ih.plugins.make_adjoint("truncated", kk=2)


@pytest.mark.parametrize(
    ("build", "bad_key", "valid"),
    [
        (lambda: ih.Anderson(max_iter=30), "max_iter", "max_steps, tol, m,"),
        (lambda: ih.Implicit(b_tol=1e-3), "b_tol", "linear_solver, max_steps, tol,"),
        (lambda: ih.NMF(rank=8, stepz=3), "stepz", "rank, solver, adjoint, .*, steps, eval_steps,"),
    ],
)
def test_a_constructor_given_an_unknown_key_lists_the_valid_options(build, bad_key, valid) -> None:
    # the classes are the public API as much as make_* (torchdeq's max_iter / b_tol users)
    with pytest.raises(TypeError, match=rf"unknown option\(s\) {bad_key} for .*valid options: "
                                        rf"{valid}"):  # fmt: skip
        build()


def test_a_constructor_keeps_its_own_type_errors() -> None:
    # a TypeError that is not about an unknown key passes through unchanged
    with pytest.raises(TypeError, match="positional argument"):
        ih.Truncated(1, 2)  # type: ignore[call-arg]
    assert ih.Truncated(3).k == 3 and ih.Anderson(max_steps=30).max_steps == 30


def test_an_object_that_is_neither_a_name_nor_an_instance_is_rejected() -> None:
    with pytest.raises(TypeError, match="expected a solver"):
        ih.fixed_point(halve, torch.ones(2, 3, dtype=DT), solver=ih.OneStep())


# --- invalid parameters --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "build",
    [
        lambda: ih.Truncated(0),
        lambda: ih.Truncated(-1),
        lambda: ih.Phantom(k=0),
        lambda: ih.Neumann(k=-3),
        lambda: ih.plugins.make_adjoint("truncated", k=0),
    ],
)
def test_zero_or_negative_k_is_rejected(build) -> None:
    with pytest.raises(ValueError, match="k must be an integer >= 1"):
        build()


@pytest.mark.parametrize("tau", [0.0, -0.5, 1.5])
@pytest.mark.parametrize("mode", [ih.Phantom, ih.Neumann])
def test_tau_outside_the_unit_interval_is_rejected(mode, tau) -> None:
    with pytest.raises(ValueError, match=r"tau must lie in \(0, 1\]"):
        mode(k=2, tau=tau)


@pytest.mark.parametrize(
    ("build", "match"),
    [
        # max_steps=0 is the default: 6 without a tolerance, 100 with one
        (lambda: ih.FixedPointIteration(max_steps=-2), "max_steps must be an integer >= 1"),
        (lambda: ih.FixedPointIteration(tol=-1e-3), "tol must be a positive number or None"),
        (lambda: ih.FixedPointIteration(damping=0.0), r"damping must lie in \(0, 1\]"),
        (lambda: ih.FixedPointIteration(stop_mode="max"), "stop_mode must be one of rel, abs"),
        (lambda: ih.Anderson(m=1), "m must be an integer >= 2"),
        (lambda: ih.Implicit(on_divergence="ignore"), "on_divergence must be one of warn, raise"),
    ],
)
def test_invalid_solver_settings_are_rejected(build, match) -> None:
    with pytest.raises(ValueError, match=match):
        build()


# --- f and z0 that do not fit ---------------------------------------------------------------------


def test_f_returning_another_shape_is_rejected() -> None:
    z0 = torch.ones(2, 3, dtype=DT)
    with pytest.raises(
        ValueError, match=r"state\[0\] with shape \(2, 2\), but z0 has shape \(2, 3\)"
    ):
        ih.fixed_point(lambda z: z[:, :2], z0)


def test_f_returning_another_structure_is_rejected() -> None:
    z0 = (torch.ones(2, 3, dtype=DT), torch.ones(2, 4, dtype=DT))
    with pytest.raises(ValueError, match="f must return the same structure as z0"):
        ih.fixed_point(lambda z: z[0], z0)
    with pytest.raises(ValueError, match="same structure as z0"):
        ih.fixed_point(lambda z: (z[0],), z0)


def test_z0_with_mixed_batch_sizes_is_rejected() -> None:
    z0 = (torch.ones(2, 3, dtype=DT), torch.ones(3, 3, dtype=DT))
    with pytest.raises(ValueError, match=r"share the batch size.*\(2, 3\), \(3, 3\)"):
        ih.fixed_point(lambda z: z, z0)


def test_z0_with_mixed_dtypes_or_integers_is_rejected() -> None:
    with pytest.raises(TypeError, match="share one dtype"):
        ih.fixed_point(lambda z: z, (torch.ones(2, 3, dtype=DT), torch.ones(2, 3)))
    with pytest.raises(TypeError, match="floating dtype"):
        ih.fixed_point(lambda z: z, torch.ones(2, 3, dtype=torch.long))


# --- non-finite iterates ----------------------------------------------------------------------


def blows_up_at_step_3(state: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
    """state[0] contracts; state[1] = (c, y) counts steps, c' = c + 1, and y' = 1 / (2 - c) is
    0.5, 1, inf at steps 1, 2, 3 (from c = 0): the first non-finite value is step 3, state[1]."""
    u, w = state
    c = w[:, :1]
    return 0.5 * u, torch.cat([c + 1, 1 / (2 - c)], dim=1)


@pytest.mark.parametrize("tol", [None, 1e-6])
def test_non_finite_iterate_names_the_step_and_state_index(tol) -> None:
    """A transient inf (f maps it back to finite values at the next step) is found by the
    per-step check: with a tolerance, or with the trace (the default fixed-budget path checks
    the final state only, see test_fixed_budget_finite_check_*)."""
    z0 = (torch.ones(2, 3, dtype=DT), torch.zeros(2, 2, dtype=DT))
    solver = ih.FixedPointIteration(max_steps=10, tol=tol, trace=tol is None)
    with pytest.raises(ih.NonFiniteError, match=r"state\[1\] at forward step 3"):
        ih.fixed_point(blows_up_at_step_3, z0, solver=solver)


def overflowing_map(state: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
    """state[0] contracts; state[1] = 1 is multiplied by 2^400 per step: 2^800 (finite, but its
    square overflows) after step 2, inf (float64 max ~2^1024) at step 3."""
    u, w = state
    return 0.5 * u, w * 2.0**400


@pytest.mark.parametrize(
    "tol",
    [
        None,
        1e-6,
    ],
)
@pytest.mark.filterwarnings("ignore::implicit_ham.ConvergenceWarning")
def test_overflow_during_iteration_is_an_error(tol) -> None:
    z0 = (torch.ones(2, 3, dtype=DT), torch.ones(2, 1, dtype=DT))
    solver = ih.FixedPointIteration(max_steps=10, tol=tol)
    with pytest.raises(ih.NonFiniteError, match=r"state\[1\] at forward step [23]"):
        ih.fixed_point(overflowing_map, z0, solver=solver)


def test_non_finite_initial_state_is_named() -> None:
    z0 = torch.tensor([[1.0, float("nan")]], dtype=DT)
    with pytest.raises(ih.NonFiniteError, match=r"state\[0\] at the initial state z0"):
        ih.fixed_point(halve, z0, solver=ih.FixedPointIteration(max_steps=3))


def test_unroll_through_anderson_is_rejected() -> None:
    x = torch.ones(2, 3, dtype=DT, requires_grad=True)
    with pytest.raises(ValueError, match="cannot be unrolled"):
        ih.fixed_point(
            lambda z, x: 0.5 * z + x,
            torch.zeros(2, 3, dtype=DT),
            x,
            solver=ih.Anderson(),
            adjoint=ih.Unroll(),
        )


@pytest.mark.skipif(sys.version_info < (3, 11), reason="exception notes need Python 3.11")
def test_an_error_inside_f_is_kept_and_names_the_shapes_f_was_called_with() -> None:
    weight = torch.randn(16, 16)
    x = torch.randn(8, 16)
    with pytest.raises(RuntimeError, match="mat1 and mat2 shapes cannot be multiplied") as caught:
        ih.fixed_point(lambda z, x: torch.tanh(z @ weight.T + x), torch.zeros(8, 15), x)
    (note,) = caught.value.__notes__
    assert "z: (8, 15) torch.float32 (z0's shape and dtype)" in note
    assert "args: (8, 16) torch.float32" in note

    # a tuple state: every tensor of it is named
    def broken(z: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        raise ZeroDivisionError("in f")

    with pytest.raises(ZeroDivisionError, match="in f") as caught:
        ih.fixed_point(broken, (torch.zeros(2, 3), torch.zeros(2)))
    assert "z: (2, 3) torch.float32, (2,) torch.float32" in caught.value.__notes__[0]


@pytest.mark.skipif(sys.version_info < (3, 11), reason="exception notes need Python 3.11")
def test_an_error_inside_a_minimize_loss_names_the_shapes_it_was_called_with() -> None:
    a = torch.randn(5, 3, dtype=DT)
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied") as caught:
        ih.minimize(lambda z, y: (z @ a - y).square().sum(), torch.zeros(1, 3, dtype=DT),
                    torch.zeros(5, dtype=DT))  # fmt: skip
    (note,) = caught.value.__notes__
    assert note.startswith("implicit_ham.minimize: raised inside loss(z, *args)")
    assert "z: (1, 3) torch.float64 (z0's shape and dtype) and args: (5,) torch.float64" in note
