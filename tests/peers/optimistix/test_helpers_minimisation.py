"""optimistix's helpers.py minimisation problems against minimize(LBFGS).

Source: patrick-kidger/optimistix, `tests/helpers.py`
(the facts: the docstring of `implicit_ham/testing/peer_cases/optimistix.py`).
"""

import pytest
from helpers.peer_params import params, run

SOURCE = "tests/helpers.py"


@pytest.mark.parametrize("case", params("optimistix", SOURCE))
def test_case(case) -> None:
    run(case)
