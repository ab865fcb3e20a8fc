"""The kit's peer and MGH suites: ``check_minimizer(..., suite=...)`` and the MGH data module
against independent references (closed-form minimisers, SciPy's MINPACK)."""

import math

import pytest
import torch

import implicit_ham as ih
from implicit_ham.testing import check_minimizer
from implicit_ham.testing.mgh import problems, solved
from implicit_ham.testing.suite_checks import mgh_suite, peer_suite

# closed-form minimisers from the paper: (problem, x*, f(x*))
KNOWN = [
    ("rosenbrock", (1.0, 1.0), 0.0),
    ("freudenstein_roth", (5.0, 4.0), 0.0),
    ("brown_badly_scaled", (1e6, 2e-6), 0.0),
    ("beale", (3.0, 0.5), 0.0),
    ("helical_valley", (1.0, 0.0, 0.0), 0.0),
    ("gulf", (50.0, 25.0, 1.5), 0.0),
    ("box_3d", (1.0, 10.0, 1.0), 0.0),
    ("powell_singular", (0.0,) * 4, 0.0),
    ("wood", (1.0,) * 4, 0.0),
    ("biggs_exp6", (1.0, 10.0, 1.0, 5.0, 4.0, 3.0), 0.0),
    ("extended_rosenbrock_n10", (1.0,) * 10, 0.0),
    ("variably_dimensioned_n10", (1.0,) * 10, 0.0),
    ("brown_almost_linear_n10", (1.0,) * 10, 0.0),
    ("linear_full_rank", (-1.0,) * 5, 5.0),
]


@pytest.mark.parametrize(("name", "x", "f"), KNOWN, ids=[k[0] for k in KNOWN])
def test_mgh_residuals_vanish_at_the_papers_minimisers(name: str, x: tuple, f: float) -> None:
    problem = next(p for p in problems() if p.name == name)
    value = float(problem.f(torch.tensor([x], dtype=torch.float64)))
    assert value == pytest.approx(f, abs=1e-12)


def test_scipy_minpack_reaches_every_stated_minimum() -> None:
    """SciPy's lm (MINPACK) from each standard start ends at f* or at another stated minimum:
    an independent check of the formulas, the starts and the stated values."""
    optimize = pytest.importorskip("scipy.optimize")
    for p in problems():

        def res(v, p=p):
            return p.residuals(torch.tensor(v, dtype=torch.float64)[None])[0].numpy()

        out = optimize.least_squares(res, list(p.x0), method="lm", xtol=1e-15, ftol=1e-15)
        f, f0 = float((out.fun**2).sum()), float(p.f(p.start()))
        assert any(solved(f, f0, m, 1e-6) for m in (p.fstar, *p.local)), (p.name, f, p.fstar)


def test_solved_is_more_and_wild_and_rejects_nan() -> None:
    assert solved(1e-7, 10.0, 0.0, 1e-6) and not solved(2e-5, 10.0, 0.0, 1e-6)
    assert not solved(math.nan, 10.0, 0.0, 1e-6)


def test_mgh_suite_passes_and_fails_by_the_problem() -> None:
    report = mgh_suite(ih.LevenbergMarquardt(), False, names=("rosenbrock", "beale", "meyer"))
    assert [r.problem for r in report.passed] == ["rosenbrock", "beale"]
    (miss,) = report.failed  # Meyer needs ~230 LM steps; the default budget is 100
    assert miss.problem == "meyer" and miss.measured["f"] > 1e3
    again = mgh_suite(ih.LevenbergMarquardt(max_steps=400), False, names=("meyer",))
    assert again.ok and again.results[0].measured["f"] == pytest.approx(87.9458, rel=1e-5)


def test_peer_suite_runs_the_cases_on_the_plugin() -> None:
    names = ("quad_fit_implicit", "gn_enzyme_fit", "minimise_beale")
    report = peer_suite(ih.LevenbergMarquardt(), False, names=names)
    assert sorted(r.problem for r in report.passed) == ["gn_enzyme_fit", "quad_fit_implicit"]
    (absent,) = report.not_applicable  # a general loss does not apply to a residual solver
    assert absent.problem == "minimise_beale" and "needs residuals" in absent.detail
    weak = peer_suite(ih.GaussNewton(max_steps=1), False, names=("gn_enzyme_fit",))
    assert [r.problem for r in weak.failed] == ["gn_enzyme_fit"]


def test_check_minimizer_names_the_suites() -> None:
    with pytest.raises(ValueError, match="panel, peers, mgh"):
        check_minimizer(ih.LBFGS(), suite="cutest")
