"""jaxopt's lbfgs_test against minimize(LBFGS).

Source: google/jaxopt, `tests/lbfgs_test.py`
(the facts: the docstring of `implicit_ham/testing/peer_cases/jaxopt_least_squares.py`).
"""

import pytest
from helpers.peer_params import params, run

SOURCE = "tests/lbfgs_test.py"


@pytest.mark.parametrize("case", params("jaxopt", SOURCE))
def test_case(case) -> None:
    run(case)
