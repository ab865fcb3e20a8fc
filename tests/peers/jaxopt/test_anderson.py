"""jaxopt's anderson_test against fixed_point(Anderson).

Source: google/jaxopt, `tests/anderson_test.py`
(the facts: the docstring of `implicit_ham/testing/peer_cases/jaxopt_fixed_point.py`).
"""

import pytest
from helpers.peer_params import params, run

SOURCE = "tests/anderson_test.py"


@pytest.mark.parametrize("case", params("jaxopt", SOURCE))
def test_case(case) -> None:
    run(case)
