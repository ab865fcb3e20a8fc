"""jaxopt's fixed_point_iteration_test against fixed_point(FixedPointIteration).

Source: google/jaxopt, `tests/fixed_point_iteration_test.py`
(the facts: the docstring of `implicit_ham/testing/peer_cases/jaxopt_fixed_point.py`).
"""

import pytest
from helpers.peer_params import params, run

SOURCE = "tests/fixed_point_iteration_test.py"


@pytest.mark.parametrize("case", params("jaxopt", SOURCE))
def test_case(case) -> None:
    run(case)
