"""jaxopt's implicit_diff_test (ridge) against minimize / root with Implicit().

Source: google/jaxopt, `tests/implicit_diff_test.py`
(the facts: the docstring of `implicit_ham/testing/peer_cases/jaxopt_least_squares.py`).
"""

import pytest
from helpers.peer_params import params, run

SOURCE = "tests/implicit_diff_test.py"


@pytest.mark.parametrize("case", params("jaxopt", SOURCE))
def test_case(case) -> None:
    run(case)
