"""Argument checks shared by the solver and adjoint dataclasses, with messages that say the fix."""

from __future__ import annotations


def check_positive_int(owner: str, name: str, value: object, minimum: int = 1) -> None:
    """Raise ValueError unless ``value`` is an int >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{owner}: {name} must be an integer >= {minimum}, got {value!r}")


def check_budget(owner: str, max_steps: object, tol: object, minimum: int = 1) -> None:
    """Raise ValueError unless ``max_steps`` is an int >= ``minimum`` and ``tol`` a positive
    number or None (an iterative solver's budget and stopping tolerance)."""
    check_positive_int(owner, "max_steps", max_steps, minimum)
    check_tolerance(owner, "tol", tol, optional=True)


def check_unit_interval(owner: str, name: str, value: object) -> None:
    """Raise ValueError unless 0 < value <= 1 (a damping / step-size factor)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise ValueError(f"{owner}: {name} must lie in (0, 1], got {value!r}")


def check_tolerance(owner: str, name: str, value: object, optional: bool = False) -> None:
    """Raise ValueError unless ``value`` is a positive float (or None when ``optional``)."""
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        allowed = "a positive number or None" if optional else "a positive number"
        raise ValueError(f"{owner}: {name} must be {allowed}, got {value!r}")


def check_nonnegative(owner: str, name: str, value: object, meaning_of_zero: str) -> None:
    """Raise ValueError unless ``value`` is a finite number >= 0 (booleans refused)."""
    finite = isinstance(value, (int, float)) and not isinstance(value, bool) and value == value
    if not (finite and value >= 0 and value != float("inf")):  # type: ignore[operator]
        raise ValueError(
            f"{owner}: {name} must be a finite number >= 0 (0: {meaning_of_zero}), got {value!r}"
        )


def check_choice(owner: str, name: str, value: object, choices: tuple[str, ...]) -> None:
    """Raise ValueError unless ``value`` is one of ``choices``."""
    if value not in choices:
        raise ValueError(f"{owner}: {name} must be one of {', '.join(choices)}, got {value!r}")
