"""optimistix's test_minimise problems against least_squares(LevenbergMarquardt).

Source: patrick-kidger/optimistix, `tests/test_minimise.py`
(the facts: the docstring of `implicit_ham/testing/peer_cases/optimistix.py`).
"""

import pytest
from helpers.peer_params import params, run

SOURCE = "tests/test_minimise.py"


@pytest.mark.parametrize("case", params("optimistix", SOURCE))
def test_case(case) -> None:
    run(case)
