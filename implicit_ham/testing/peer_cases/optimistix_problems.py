"""The problem set of optimistix's ``tests/helpers.py`` (patrick-kidger/optimistix), and the
least-squares problems of its (older) ``tests/test_minimise.py``, as facts: every pytree is
flattened to one (1, n) state (optimistix's functions ravel their pytrees themselves), JAX
PRNG draws are drawn from a seeded ``torch.Generator`` with the same distribution.

Fixed-point maps ``f(y, *args)`` (the root problems are ``f(y) - y``), from the stated starts:

* ``cos``: ``cos(c y)``, c = 1; ``exponential``: ``exp(-c y)``, c = 1; from 0.5 ones(28)
  (optimistix's ``({"a": 0.5 ones(3, 2, 4)}, 0.5 ones(4))``).
* ``nn``: ``0.1 MLP(y)``, an MLP 28 -> 8 -> 28 with softplus; the weights (args) are drawn
  like equinox's default initialisation (uniform ±1/sqrt(fan_in)).
* ``heat``: one Crank-Nicolson step of ``y_t = (1 - y) Δy`` on 100 points of [-1, 1] from
  y0 = x², with optimistix's ``_laplacian`` as it is written (it returns y itself, not the
  Laplacian); from ones(100), c = 1.
* ``midpoint_{y,f,k}_linear``: the implicit midpoint step of ``y' = M y`` (M ~ N(0, 1),
  28 x 28) from y0 = 0, dt = 1/16, in y-, f- and k-space; from 0.5 ones(28).
* ``midpoint_{y,f,k}_robertson``: the same for Robertson's stiff chemistry (k1, k2, k3) =
  (0.04, 3e7, 1e4), dt = 1e-8; from ones(3).

Least squares (minimum of ``Σ r²``): ``diagonal_bowl`` (``y² (0.1 + w)``, w ~ N(0, 1)², from
0.05 ones(20); 0), ``rosenbrock`` (optimistix's linear variant ``(100 (y[1:] - y[:-1]),
c - y[:-1])``, c = 1; from 1.5 ones(2) and 1.5 ones(20); 0), ``simple_nn`` (an MLP 1 -> 8 -> 1,
ReLU, fitting x² on linspace(0, 1, 100) from the stated weights; the residuals are the
squared errors, as optimistix writes them; 0). From test_minimise.py:
``penalty_ii`` (n = 10 from 0.5; 2.93660e-4), ``variably_dimensioned`` (n = 10 from
1 - i/10; 0), ``trigonometric`` (n = 70 from 1/70; 0), ``rosenbrock`` from zeros(2).

Minimisation: ``bowl`` (``yᵀ AᵀA y``, A ~ N(0, 1) 20 x 20, from 0.05 ones(20); 0),
``himmelblau`` from (2, 2.5) (0), ``matyas`` from (6, 6) (0), ``beale`` from (2, 0) (0),
``square_minus_one`` (``||y||² - 1`` from 1; -1).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from implicit_ham.testing.peer_cases.common import F64

Fn = Callable[..., Tensor]


@dataclass(frozen=True)
class Problem:
    """``fn(y (1, n), *args) -> (1, m)`` (a map, residuals or a (1,) loss), its start y0 (1, n),
    its args (tensors the derivative is checked in) and the stated minimum (least squares /
    minimisation; NaN for a fixed-point map)."""

    name: str
    fn: Fn
    y0: Tensor
    args: tuple[Tensor, ...]
    minimum: float = float("nan")


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _row(values: Tensor) -> Tensor:
    return values.to(F64).reshape(1, -1)


def _softplus_mlp(y: Tensor, w1: Tensor, b1: Tensor, w2: Tensor, b2: Tensor) -> Tensor:
    return F.softplus(y @ w1.T + b1) @ w2.T + b2


def _uniform_layer(gen: torch.Generator, fan_out: int, fan_in: int) -> tuple[Tensor, Tensor]:
    bound = fan_in**-0.5
    w = (2 * torch.rand(fan_out, fan_in, generator=gen, dtype=F64) - 1) * bound
    return w, (2 * torch.rand(fan_out, generator=gen, dtype=F64) - 1) * bound


def _heat(y: Tensor, c: Tensor) -> Tensor:
    x = torch.linspace(-1, 1, 100, dtype=F64)[None]
    y0 = x**2
    # optimistix's _laplacian returns its argument (the Laplacian is computed and discarded)
    f_val, f0 = (1 - y) * y, (1 - y0) * y0
    return c * (y0 + 0.5 * (f_val + f0))


def _robertson(y: Tensor, k1: Tensor, k2: Tensor, k3: Tensor) -> Tensor:
    a, b, c = y[:, 0:1], y[:, 1:2], y[:, 2:3]
    return torch.cat([-k1 * a + k3 * b * c, k1 * a - k2 * b**2 - k3 * b * c, k2 * b**2], 1)


def fixed_point_problems() -> list[Problem]:
    """helpers.py's ``fixed_point_fn_init_args``."""
    half, one = torch.full((1, 28), 0.5, dtype=F64), torch.ones(1, 1, dtype=F64)
    gen = _gen(19)
    matrix = torch.randn(28, 28, generator=gen, dtype=F64)
    w1, b1 = _uniform_layer(gen, 8, 28)
    w2, b2 = _uniform_layer(gen, 28, 8)
    dt = 1 / 16
    robertson = (
        torch.tensor(0.04, dtype=F64),
        torch.tensor(3e7, dtype=F64),
        torch.tensor(1e4, dtype=F64),
    )
    rdt = 1e-8
    ones3 = torch.ones(1, 3, dtype=F64)
    return [
        Problem("cos", lambda y, c: torch.cos(c * y), half, (one,)),
        Problem("exponential", lambda y, c: torch.exp(-c * y), half, (one,)),
        Problem("nn", lambda y, *w: 0.1 * _softplus_mlp(y, *w), half, (w1, b1, w2, b2)),
        Problem("heat", _heat, torch.ones(1, 100, dtype=F64), (one,)),
        Problem("midpoint_y_linear", lambda y, m: dt * (0.5 * y) @ m.T, half, (matrix,)),
        Problem("midpoint_f_linear", lambda y, m: (dt * y) @ m.T, half, (matrix,)),
        Problem("midpoint_k_linear", lambda y, m: dt * (y @ m.T), half, (matrix,)),
        Problem(
            "midpoint_y_robertson", lambda y, *k: rdt * _robertson(0.5 * y, *k), ones3, robertson
        ),
        Problem("midpoint_f_robertson", lambda y, *k: _robertson(rdt * y, *k), ones3, robertson),
        Problem("midpoint_k_robertson", lambda y, *k: rdt * _robertson(y, *k), ones3, robertson),
    ]


def _linear_rosenbrock(y: Tensor, c: Tensor) -> Tensor:
    return torch.cat([100 * (y[:, 1:] - y[:, :-1]), c - y[:, :-1]], 1)


SIMPLE_NN_WEIGHTS = (
    (
        3.39958394,
        -0.00648151,
        -0.57178741,
        -0.9259611,
        0.43010087,
        0.74950293,
        -0.35932756,
        1.28393738,
    ),
    (
        -0.14702571,
        3.61400359,
        -1.01404942,
        0.3223137,
        2.19991259,
        -0.51860872,
        0.4717813,
        0.9449359,
    ),
    (0.26476087, 0.05913492, 0.40830152, 0.704758, 0.64347694, 0.85807767, 0.54285774, 0.05507022),
    (-2.16578771,),
)


def _simple_nn(y: Tensor, data: Tensor) -> Tensor:
    w1, b1, w2, b2 = y[:, :8], y[:, 8:16], y[:, 16:24], y[:, 24:]
    hidden = torch.relu(data[None, :, None] * w1[:, None, :] + b1[:, None, :])  # (1, 100, 8)
    pred = (hidden * w2[:, None, :]).sum(2) + b2
    return (pred - data[None] ** 2) ** 2  # optimistix's residuals are the squared errors


def _penalty_ii(y: Tensor) -> Tensor:
    n = y.shape[1]
    i = torch.arange(2, n + 1, dtype=F64)
    targets = torch.exp(i / 10) + torch.exp((i - 1) / 10)
    a = 1e-5**0.5
    # optimistix's variant, as written: exp(x_i/10) - exp(x_{i-1}/10) - y_i
    term2 = a * (torch.exp(y[:, 1:] / 10) - torch.exp(y[:, :-1] / 10) - targets)
    term3 = a * (torch.exp(y[:, 1:] / 10) - torch.exp(torch.tensor(-0.1, dtype=F64)))
    weights = torch.arange(n, 0, -1, dtype=F64)
    term4 = (weights * y**2).sum(1, keepdim=True) - 1
    return torch.cat([y[:, :1] - 0.2, term4, term2, term3], 1)


def _variably_dimensioned(y: Tensor) -> Tensor:
    s = (torch.arange(1, y.shape[1] + 1, dtype=F64) * (y - 1)).sum(1, keepdim=True)
    return torch.cat([s, s**2, y - 1], 1)


def _trigonometric(y: Tensor) -> Tensor:
    i = torch.arange(1, y.shape[1] + 1, dtype=F64)
    return y.shape[1] - torch.cos(y).sum(1, keepdim=True) + i * (1 - torch.cos(y)) - torch.sin(y)


def least_squares_problems() -> list[Problem]:
    """helpers.py's ``least_squares_fn_minima_init_args`` (test_least_squares.py)."""
    w = torch.randn(1, 20, generator=_gen(17), dtype=F64) ** 2
    one = torch.ones(1, 1, dtype=F64)
    nn0 = _row(torch.tensor([v for layer in SIMPLE_NN_WEIGHTS for v in layer], dtype=F64))
    return [
        Problem(
            "diagonal_bowl",
            lambda y, w: y**2 * (0.1 + w),
            torch.full((1, 20), 0.05, dtype=F64),
            (w,),
            0.0,
        ),
        Problem("rosenbrock", _linear_rosenbrock, torch.full((1, 2), 1.5, dtype=F64), (one,), 0.0),
        Problem(
            "rosenbrock_tree", _linear_rosenbrock, torch.full((1, 20), 1.5, dtype=F64), (one,), 0.0
        ),
        Problem("simple_nn", _simple_nn, nn0, (torch.linspace(0, 1, 100, dtype=F64),), 0.0),
    ]


def test_minimise_problems() -> list[Problem]:
    """The least-squares problems of the stored (older) test_minimise.py, minimised with LM."""
    return [
        Problem(
            "rosenbrock_zeros",
            lambda y: _linear_rosenbrock(y, torch.ones(1, 1, dtype=F64)),
            torch.zeros(1, 2, dtype=F64),
            (),
            0.0,
        ),
        Problem(
            "rosenbrock_tree",
            lambda y: _linear_rosenbrock(y, torch.ones(1, 1, dtype=F64)),
            torch.full((1, 20), 1.5, dtype=F64),
            (),
            0.0,
        ),
        Problem("penalty_ii", _penalty_ii, torch.full((1, 10), 0.5, dtype=F64), (), 2.93660e-4),
        Problem(
            "variably_dimensioned",
            _variably_dimensioned,
            1 - torch.arange(1, 11, dtype=F64)[None] / 10,
            (),
            0.0,
        ),
        Problem("trigonometric", _trigonometric, torch.full((1, 70), 1 / 70, dtype=F64), (), 0.0),
    ]


def minimisation_problems() -> list[Problem]:
    """helpers.py's ``minimisation_fn_minima_init_args``: losses (1,)."""
    a = torch.randn(20, 20, generator=_gen(17), dtype=F64)
    gram = a.T @ a

    def himmelblau(y: Tensor, c1: Tensor, c2: Tensor) -> Tensor:
        u, v = y[:, 0], y[:, 1]
        return (u**2 + v - c1) ** 2 + (u + v**2 - c2) ** 2

    def matyas(y: Tensor, c1: Tensor, c2: Tensor) -> Tensor:
        u, v = y[:, 0], y[:, 1]
        return c1 * (u**2 + v**2) - c2 * u * v

    def beale(y: Tensor, c1: Tensor, c2: Tensor, c3: Tensor) -> Tensor:
        u, v = y[:, 0], y[:, 1]
        return (c1 - u + u * v) ** 2 + (c2 - u + u * v**2) ** 2 + (c3 - u + u * v**3) ** 2

    def c(*values: float) -> tuple[Tensor, ...]:
        return tuple(torch.tensor(v, dtype=F64) for v in values)

    return [
        Problem(
            "bowl",
            lambda y, g: ((y @ g) * y).sum(1),
            torch.full((1, 20), 0.05, dtype=F64),
            (gram,),
            0.0,
        ),
        Problem("himmelblau", himmelblau, torch.tensor([[2.0, 2.5]], dtype=F64), c(11.0, 7.0), 0.0),
        Problem("matyas", matyas, torch.tensor([[6.0, 6.0]], dtype=F64), c(0.26, 0.48), 0.0),
        Problem("beale", beale, torch.tensor([[2.0, 0.0]], dtype=F64), c(1.5, 2.25, 2.625), 0.0),
        Problem(
            "square_minus_one", lambda y: (y**2).sum(1) - 1, torch.ones(1, 1, dtype=F64), (), -1.0
        ),
    ]
