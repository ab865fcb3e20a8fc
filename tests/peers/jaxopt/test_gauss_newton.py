"""jaxopt's gauss_newton_test against least_squares(GaussNewton).

Source: google/jaxopt, `tests/gauss_newton_test.py`
(the facts: the docstring of `implicit_ham/testing/peer_cases/jaxopt_least_squares.py`).
"""

import pytest
from helpers.peer_params import params, run

SOURCE = "tests/gauss_newton_test.py"


@pytest.mark.parametrize("case", params("jaxopt", SOURCE))
def test_case(case) -> None:
    run(case)
