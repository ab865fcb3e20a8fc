"""optimistix's test_fixed_point on helpers.py's fixed-point problems against fixed_point.

Source: patrick-kidger/optimistix, `tests/test_fixed_point.py`
(the facts: the docstring of `implicit_ham/testing/peer_cases/optimistix.py`).
"""

import pytest
from helpers.peer_params import params, run

SOURCE = "tests/test_fixed_point.py"


@pytest.mark.parametrize("case", params("optimistix", SOURCE))
def test_case(case) -> None:
    run(case)
