"""optimistix's test_least_squares on helpers.py's least-squares problems against least_squares.

Source: patrick-kidger/optimistix, `tests/test_least_squares.py`
(the facts: the docstring of `implicit_ham/testing/peer_cases/optimistix.py`).
"""

import pytest
from helpers.peer_params import params, run

SOURCE = "tests/test_least_squares.py"


@pytest.mark.parametrize("case", params("optimistix", SOURCE))
def test_case(case) -> None:
    run(case)
