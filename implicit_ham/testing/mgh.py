"""The Moré-Garbow-Hillstrom unconstrained test set (J. J. Moré, B. S. Garbow, K. E. Hillstrom,
"Testing unconstrained optimization software", ACM TOMS 7(1), 1981, pp. 17-41): the problems
with closed forms, as residuals ``r(x)`` of ``f(x) = Σ r(x)²`` (the paper's f, without ½),
at the paper's standard starting points, with the minima it states.

``problems()`` lists them (dimensions fixed as below); each ``MGHProblem`` has ``residuals``
(B, n) -> (B, m), ``x0`` (n,), ``fstar`` (the stated global minimum) and ``local`` (other
stated minima: a solver that stops at one found a minimum, not the global one). Problems
whose global minimum the paper does not state in closed form for the dimension used are left
out. ``solved(f, f0, fstar, tau)`` is the criterion the benchmark counts: Moré & Wild's
(SIAM J. Optim. 20(1), 2009) convergence test ``f - f* <= tau (f0 - f*)``.

Numbering (the paper's): 1 Rosenbrock, 2 Freudenstein-Roth, 3 Powell badly scaled, 4 Brown
badly scaled, 5 Beale, 6 Jennrich-Sampson (m = 10), 7 helical valley, 8 Bard, 9 Gaussian,
10 Meyer, 11 Gulf research (m = 99), 12 Box 3-D (m = 10), 13 Powell singular, 14 Wood,
15 Kowalik-Osborne, 16 Brown-Dennis (m = 20), 17 Osborne 1, 18 Biggs EXP6 (m = 13),
19 Osborne 2, 20 Watson (n = 6, 9), 21 extended Rosenbrock (n = 10), 22 extended Powell
singular (n = 12), 23 penalty I (n = 4, 10), 24 penalty II (n = 4, 10), 25 variably
dimensioned (n = 10), 26 trigonometric (n = 10), 27 Brown almost-linear (n = 10),
28 discrete boundary value (n = 10), 29 discrete integral equation (n = 10), 30 Broyden
tridiagonal (n = 10), 31 Broyden banded (n = 10), 32 linear full rank (n = 5, m = 10),
33 linear rank 1 (n = 5, m = 10), 34 linear rank 1 with zero columns and rows (n = 5,
m = 10), 35 Chebyquad (n = m = 8).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

Residuals = Callable[[Tensor], Tensor]


@dataclass(frozen=True)
class MGHProblem:
    """One problem of the set.

    Attributes:
        number: the paper's number. name: e.g. "rosenbrock" or "watson_n9".
        residuals: ``r(x)`` (B, n) -> (B, m), any float dtype.
        x0: the standard starting point, (n,) float64 values.
        fstar: the stated global minimum of ``Σ r²``.
        local: other minima the paper states (a stop there is a local minimum).
    """

    number: int
    name: str
    residuals: Residuals
    x0: tuple[float, ...]
    fstar: float
    local: tuple[float, ...] = ()

    @property
    def n(self) -> int:
        """The number of variables."""
        return len(self.x0)

    def start(self, dtype: torch.dtype = torch.float64) -> Tensor:
        """x0 as a (1, n) tensor."""
        return torch.tensor([self.x0], dtype=dtype)

    def f(self, x: Tensor) -> Tensor:
        """``Σ r(x)²`` per row: (B, n) -> (B,)."""
        return (self.residuals(x) ** 2).sum(-1)


def solved(f: float, f0: float, fstar: float, tau: float) -> bool:
    """Moré & Wild's test ``f - f* <= tau (f0 - f*)`` (False for a non-finite f)."""
    return math.isfinite(f) and f - fstar <= tau * (f0 - fstar)


def _c(x: Tensor, values: tuple[float, ...] | list[float]) -> Tensor:
    return torch.tensor(values, dtype=x.dtype, device=x.device)


def _i(x: Tensor, m: int, start: int = 1) -> Tensor:
    return torch.arange(start, start + m, dtype=x.dtype, device=x.device)


def _rosenbrock(x: Tensor) -> Tensor:
    return torch.stack([10 * (x[:, 1] - x[:, 0] ** 2), 1 - x[:, 0]], 1)


def _freudenstein_roth(x: Tensor) -> Tensor:
    x1, x2 = x[:, 0], x[:, 1]
    return torch.stack(
        [-13 + x1 + ((5 - x2) * x2 - 2) * x2, -29 + x1 + ((x2 + 1) * x2 - 14) * x2], 1
    )


def _powell_badly_scaled(x: Tensor) -> Tensor:
    x1, x2 = x[:, 0], x[:, 1]
    return torch.stack([1e4 * x1 * x2 - 1, torch.exp(-x1) + torch.exp(-x2) - 1.0001], 1)


def _brown_badly_scaled(x: Tensor) -> Tensor:
    x1, x2 = x[:, 0], x[:, 1]
    return torch.stack([x1 - 1e6, x2 - 2e-6, x1 * x2 - 2], 1)


def _beale(x: Tensor) -> Tensor:
    i = _i(x, 3)
    return _c(x, (1.5, 2.25, 2.625)) - x[:, :1] * (1 - x[:, 1:2] ** i)


def _jennrich_sampson(x: Tensor) -> Tensor:
    i = _i(x, 10)
    return 2 + 2 * i - (torch.exp(i * x[:, :1]) + torch.exp(i * x[:, 1:2]))


def _helical_valley(x: Tensor) -> Tensor:
    x1, x2, x3 = x[:, 0], x[:, 1], x[:, 2]
    theta = torch.atan(x2 / x1) / (2 * math.pi) + torch.where(x1 < 0, 0.5, 0.0)
    radius = torch.sqrt(x1**2 + x2**2)
    return torch.stack([10 * (x3 - 10 * theta), 10 * (radius - 1), x3], 1)


BARD_Y = (0.14, 0.18, 0.22, 0.25, 0.29, 0.32, 0.35, 0.39, 0.37, 0.58, 0.73, 0.96, 1.34, 2.10, 4.39)


def _bard(x: Tensor) -> Tensor:
    u = _i(x, 15)
    v = 16 - u
    w = torch.minimum(u, v)
    return _c(x, BARD_Y) - (x[:, :1] + u / (v * x[:, 1:2] + w * x[:, 2:3]))


GAUSSIAN_Y = (0.0009, 0.0044, 0.0175, 0.0540, 0.1295, 0.2420, 0.3521, 0.3989)


def _gaussian(x: Tensor) -> Tensor:
    t = (8 - _i(x, 15)) / 2
    y = _c(x, GAUSSIAN_Y + GAUSSIAN_Y[-2::-1])
    return x[:, :1] * torch.exp(-x[:, 1:2] * (t - x[:, 2:3]) ** 2 / 2) - y


MEYER_Y = (
    34780, 28610, 23650, 19630, 16370, 13720, 11540, 9744,
    8261, 7030, 6005, 5147, 4427, 3820, 3307, 2872,
)  # fmt: skip


def _meyer(x: Tensor) -> Tensor:
    t = 45 + 5 * _i(x, 16)
    return x[:, :1] * torch.exp(x[:, 1:2] / (t + x[:, 2:3])) - _c(x, [float(v) for v in MEYER_Y])


def _gulf(x: Tensor) -> Tensor:
    t = _i(x, 99) / 100
    y = 25 + (-50 * torch.log(t)) ** (2 / 3)
    return torch.exp(-((y - x[:, 1:2]).abs() ** x[:, 2:3]) / x[:, :1]) - t


def _box_3d(x: Tensor) -> Tensor:
    t = _i(x, 10) / 10
    x1, x2, x3 = x[:, :1], x[:, 1:2], x[:, 2:3]
    return torch.exp(-t * x1) - torch.exp(-t * x2) - x3 * (torch.exp(-t) - torch.exp(-10 * t))


def _powell_singular(x: Tensor) -> Tensor:
    x1, x2, x3, x4 = (x[:, j::4] for j in range(4))
    r = [x1 + 10 * x2, 5**0.5 * (x3 - x4), (x2 - 2 * x3) ** 2, 10**0.5 * (x1 - x4) ** 2]
    return torch.stack(r, 2).reshape(x.shape[0], -1)


def _wood(x: Tensor) -> Tensor:
    x1, x2, x3, x4 = x[:, 0], x[:, 1], x[:, 2], x[:, 3]
    return torch.stack(
        [
            10 * (x2 - x1**2), 1 - x1, 90**0.5 * (x4 - x3**2), 1 - x3,
            10**0.5 * (x2 + x4 - 2), 10**-0.5 * (x2 - x4),
        ],
        1,
    )  # fmt: skip


KOWALIK_Y = (0.1957, 0.1947, 0.1735, 0.1600, 0.0844, 0.0627, 0.0456, 0.0342, 0.0323, 0.0235, 0.0246)
KOWALIK_U = (4, 2, 1, 0.5, 0.25, 0.167, 0.125, 0.1, 0.0833, 0.0714, 0.0625)


def _kowalik_osborne(x: Tensor) -> Tensor:
    u = _c(x, KOWALIK_U)
    num = x[:, :1] * (u**2 + u * x[:, 1:2])
    return _c(x, KOWALIK_Y) - num / (u**2 + u * x[:, 2:3] + x[:, 3:4])


def _brown_dennis(x: Tensor) -> Tensor:
    t = _i(x, 20) / 5
    a = x[:, :1] + t * x[:, 1:2] - torch.exp(t)
    b = x[:, 2:3] + x[:, 3:4] * torch.sin(t) - torch.cos(t)
    return a**2 + b**2


OSBORNE1_Y = (
    0.844, 0.908, 0.932, 0.936, 0.925, 0.908, 0.881, 0.850, 0.818, 0.784, 0.751, 0.718,
    0.685, 0.658, 0.628, 0.603, 0.580, 0.558, 0.538, 0.522, 0.506, 0.490, 0.478, 0.467,
    0.457, 0.448, 0.438, 0.431, 0.424, 0.420, 0.414, 0.411, 0.406,
)  # fmt: skip


def _osborne1(x: Tensor) -> Tensor:
    t = 10 * _i(x, 33, 0)
    model = x[:, :1] + x[:, 1:2] * torch.exp(-t * x[:, 3:4]) + x[:, 2:3] * torch.exp(-t * x[:, 4:5])
    return _c(x, OSBORNE1_Y) - model


def _biggs(x: Tensor) -> Tensor:
    t = _i(x, 13) / 10
    y = torch.exp(-t) - 5 * torch.exp(-10 * t) + 3 * torch.exp(-4 * t)
    x1, x2, x3, x4, x5, x6 = (x[:, j : j + 1] for j in range(6))
    return x3 * torch.exp(-t * x1) - x4 * torch.exp(-t * x2) + x6 * torch.exp(-t * x5) - y


OSBORNE2_Y = (
    1.366, 1.191, 1.112, 1.013, 0.991, 0.885, 0.831, 0.847, 0.786, 0.725, 0.746, 0.679, 0.608,
    0.655, 0.616, 0.606, 0.602, 0.626, 0.651, 0.724, 0.649, 0.649, 0.694, 0.644, 0.624, 0.661,
    0.612, 0.558, 0.533, 0.495, 0.500, 0.423, 0.395, 0.375, 0.372, 0.391, 0.396, 0.405, 0.428,
    0.429, 0.523, 0.562, 0.607, 0.653, 0.672, 0.708, 0.633, 0.668, 0.645, 0.632, 0.591, 0.559,
    0.597, 0.625, 0.739, 0.710, 0.729, 0.720, 0.636, 0.581, 0.428, 0.292, 0.162, 0.098, 0.054,
)  # fmt: skip


def _osborne2(x: Tensor) -> Tensor:
    t = _i(x, 65, 0) / 10
    c = [x[:, j : j + 1] for j in range(11)]
    model = (
        c[0] * torch.exp(-t * c[4])
        + c[1] * torch.exp(-((t - c[8]) ** 2) * c[5])
        + c[2] * torch.exp(-((t - c[9]) ** 2) * c[6])
        + c[3] * torch.exp(-((t - c[10]) ** 2) * c[7])
    )
    return _c(x, OSBORNE2_Y) - model


def _watson(x: Tensor) -> Tensor:
    n = x.shape[1]
    t = (_i(x, 29) / 29)[:, None]  # (29, 1)
    j = _i(x, n, 0)  # 0..n-1
    powers = t**j  # (29, n): t^(j-1) for the paper's j = 1..n
    derivative = (j[1:] * powers[:, :-1] * x[:, None, 1:]).sum(-1)  # Σ_{j>=2} (j-1) x_j t^(j-2)
    value = (powers * x[:, None, :]).sum(-1)
    r = derivative - value**2 - 1
    return torch.cat([r, x[:, :1], (x[:, 1] - x[:, 0] ** 2 - 1)[:, None]], 1)


def _extended_rosenbrock(x: Tensor) -> Tensor:
    odd, even = x[:, 0::2], x[:, 1::2]
    return torch.stack([10 * (even - odd**2), 1 - odd], 2).reshape(x.shape[0], -1)


def _penalty1(x: Tensor) -> Tensor:
    return torch.cat([1e-5**0.5 * (x - 1), (x**2).sum(1, keepdim=True) - 0.25], 1)


def _penalty2(x: Tensor) -> Tensor:
    n, a = x.shape[1], 1e-5**0.5
    i = _i(x, n - 1, 2)
    y = torch.exp(i / 10) + torch.exp((i - 1) / 10)
    middle = a * (torch.exp(x[:, 1:] / 10) + torch.exp(x[:, :-1] / 10) - y)
    tail = a * (torch.exp(x[:, 1:] / 10) - math.exp(-0.1))
    last = ((n - _i(x, n, 0)) * x**2).sum(1, keepdim=True) - 1
    return torch.cat([x[:, :1] - 0.2, middle, tail, last], 1)


def _variably_dimensioned(x: Tensor) -> Tensor:
    s = (_i(x, x.shape[1]) * (x - 1)).sum(1, keepdim=True)
    return torch.cat([x - 1, s, s**2], 1)


def _trigonometric(x: Tensor) -> Tensor:
    n = x.shape[1]
    i = _i(x, n)
    return n - torch.cos(x).sum(1, keepdim=True) + i * (1 - torch.cos(x)) - torch.sin(x)


def _brown_almost_linear(x: Tensor) -> Tensor:
    n = x.shape[1]
    head = x[:, :-1] + x.sum(1, keepdim=True) - (n + 1)
    return torch.cat([head, x.prod(1, keepdim=True) - 1], 1)


def _boundary_terms(x: Tensor) -> tuple[Tensor, Tensor]:
    n = x.shape[1]
    h = 1 / (n + 1)
    t = _i(x, n) * h
    return t, (x + t + 1) ** 3


def _discrete_boundary_value(x: Tensor) -> Tensor:
    h = 1 / (x.shape[1] + 1)
    _, cube = _boundary_terms(x)
    padded = torch.nn.functional.pad(x, (1, 1))
    return 2 * x - padded[:, :-2] - padded[:, 2:] + h**2 * cube / 2


def _discrete_integral_equation(x: Tensor) -> Tensor:
    n = x.shape[1]
    h = 1 / (n + 1)
    t, cube = _boundary_terms(x)
    lower = torch.tril(torch.ones(n, n, dtype=x.dtype, device=x.device))  # j <= i
    left = (lower * (t * cube[:, None, :])).sum(-1)  # Σ_{j<=i} t_j (x_j + t_j + 1)^3
    right = ((1 - lower) * ((1 - t) * cube[:, None, :])).sum(-1)  # Σ_{j>i}
    return x + h * ((1 - t) * left + t * right) / 2


def _broyden_tridiagonal(x: Tensor) -> Tensor:
    padded = torch.nn.functional.pad(x, (1, 1))
    return (3 - 2 * x) * x - padded[:, :-2] - 2 * padded[:, 2:] + 1


def _broyden_banded(x: Tensor) -> Tensor:
    n = x.shape[1]
    i = torch.arange(n, device=x.device)
    band = (
        (i[None, :] >= (i[:, None] - 5))
        & (i[None, :] <= i[:, None] + 1)
        & (i[None, :] != i[:, None])
    )
    terms = (band.to(x.dtype) * (x * (1 + x))[:, None, :]).sum(-1)
    return x * (2 + 5 * x**2) + 1 - terms


def _linear_full_rank(x: Tensor, m: int = 10) -> Tensor:
    s = 2 * x.sum(1, keepdim=True) / m
    return torch.cat([x - s - 1, (-s - 1).expand(-1, m - x.shape[1])], 1)


def _linear_rank1(x: Tensor, m: int = 10) -> Tensor:
    s = (_i(x, x.shape[1]) * x).sum(1, keepdim=True)
    return _i(x, m) * s - 1


def _linear_rank1_zeros(x: Tensor, m: int = 10) -> Tensor:
    n = x.shape[1]
    s = (_i(x, n - 2, 2) * x[:, 1:-1]).sum(1, keepdim=True)
    middle = (_i(x, m - 2, 1)) * s - 1  # (i - 1) s - 1 for i = 2..m-1
    minus_one = -torch.ones_like(s)
    return torch.cat([minus_one, middle, minus_one], 1)


def _chebyquad(x: Tensor) -> Tensor:
    n = x.shape[1]
    y = 2 * x - 1
    t_prev, t_cur = torch.ones_like(y), y
    rows = []
    for i in range(1, n + 1):
        integral = -1 / (i * i - 1) if i % 2 == 0 else 0.0
        rows.append(t_cur.mean(1) - integral)
        t_prev, t_cur = t_cur, 2 * y * t_cur - t_prev
    return torch.stack(rows, 1)


def problems() -> list[MGHProblem]:
    """The set (see the module docstring), in the paper's order."""
    ten = 10
    boundary_x0 = tuple((j / (ten + 1)) * (j / (ten + 1) - 1) for j in range(1, ten + 1))
    m = 10
    return [
        MGHProblem(1, "rosenbrock", _rosenbrock, (-1.2, 1.0), 0.0),
        MGHProblem(2, "freudenstein_roth", _freudenstein_roth, (0.5, -2.0), 0.0, (48.9842,)),
        MGHProblem(3, "powell_badly_scaled", _powell_badly_scaled, (0.0, 1.0), 0.0),
        MGHProblem(4, "brown_badly_scaled", _brown_badly_scaled, (1.0, 1.0), 0.0),
        MGHProblem(5, "beale", _beale, (1.0, 1.0), 0.0),
        MGHProblem(6, "jennrich_sampson", _jennrich_sampson, (0.3, 0.4), 124.362),
        MGHProblem(7, "helical_valley", _helical_valley, (-1.0, 0.0, 0.0), 0.0),
        MGHProblem(8, "bard", _bard, (1.0, 1.0, 1.0), 8.21487e-3, (17.4286,)),
        MGHProblem(9, "gaussian", _gaussian, (0.4, 1.0, 0.0), 1.12793e-8),
        MGHProblem(10, "meyer", _meyer, (0.02, 4000.0, 250.0), 87.9458),
        MGHProblem(11, "gulf", _gulf, (5.0, 2.5, 0.15), 0.0),
        MGHProblem(12, "box_3d", _box_3d, (0.0, 10.0, 20.0), 0.0),
        MGHProblem(13, "powell_singular", _powell_singular, (3.0, -1.0, 0.0, 1.0), 0.0),
        MGHProblem(14, "wood", _wood, (-3.0, -1.0, -3.0, -1.0), 0.0),
        MGHProblem(15, "kowalik_osborne", _kowalik_osborne, (0.25, 0.39, 0.415, 0.39), 3.07505e-4),
        MGHProblem(16, "brown_dennis", _brown_dennis, (25.0, 5.0, -5.0, -1.0), 85822.2),
        MGHProblem(17, "osborne1", _osborne1, (0.5, 1.5, -1.0, 0.01, 0.02), 5.46489e-5),
        MGHProblem(18, "biggs_exp6", _biggs, (1.0, 2.0, 1.0, 1.0, 1.0, 1.0), 0.0, (5.65565e-3,)),
        MGHProblem(
            19,
            "osborne2",
            _osborne2,
            (1.3, 0.65, 0.65, 0.7, 0.6, 3.0, 5.0, 7.0, 2.0, 4.5, 5.5),
            4.01377e-2,
        ),
        MGHProblem(20, "watson_n6", _watson, (0.0,) * 6, 2.28767e-3),
        MGHProblem(20, "watson_n9", _watson, (0.0,) * 9, 1.39976e-6),
        MGHProblem(21, "extended_rosenbrock_n10", _extended_rosenbrock, (-1.2, 1.0) * 5, 0.0),
        MGHProblem(22, "extended_powell_n12", _powell_singular, (3.0, -1.0, 0.0, 1.0) * 3, 0.0),
        MGHProblem(23, "penalty1_n4", _penalty1, (1.0, 2.0, 3.0, 4.0), 2.24997e-5),
        MGHProblem(
            23, "penalty1_n10", _penalty1, tuple(float(j) for j in range(1, 11)), 7.08765e-5
        ),
        MGHProblem(24, "penalty2_n4", _penalty2, (0.5,) * 4, 9.37629e-6),
        MGHProblem(24, "penalty2_n10", _penalty2, (0.5,) * 10, 2.93660e-4),
        MGHProblem(
            25,
            "variably_dimensioned_n10",
            _variably_dimensioned,
            tuple(1 - j / ten for j in range(1, ten + 1)),
            0.0,
        ),
        MGHProblem(26, "trigonometric_n10", _trigonometric, (0.1,) * 10, 0.0, (2.79506e-5,)),
        MGHProblem(27, "brown_almost_linear_n10", _brown_almost_linear, (0.5,) * 10, 0.0, (1.0,)),
        MGHProblem(28, "discrete_boundary_value_n10", _discrete_boundary_value, boundary_x0, 0.0),
        MGHProblem(
            29, "discrete_integral_equation_n10", _discrete_integral_equation, boundary_x0, 0.0
        ),
        MGHProblem(30, "broyden_tridiagonal_n10", _broyden_tridiagonal, (-1.0,) * 10, 0.0),
        MGHProblem(31, "broyden_banded_n10", _broyden_banded, (-1.0,) * 10, 0.0),
        MGHProblem(32, "linear_full_rank", _linear_full_rank, (1.0,) * 5, float(m - 5)),
        MGHProblem(33, "linear_rank1", _linear_rank1, (1.0,) * 5, m * (m - 1) / (2 * (2 * m + 1))),
        MGHProblem(
            34,
            "linear_rank1_zero_columns",
            _linear_rank1_zeros,
            (1.0,) * 5,
            (m * m + 3 * m - 6) / (2 * (2 * m - 3)),
        ),
        MGHProblem(35, "chebyquad_n8", _chebyquad, tuple(j / 9 for j in range(1, 9)), 3.51687e-3),
    ]
