"""optimistix's test_root_find on helpers.py's fixed-point problems against root(Newton).

Source: patrick-kidger/optimistix, `tests/test_root_find.py`
(the facts: the docstring of `implicit_ham/testing/peer_cases/optimistix.py`).
"""

import pytest
from helpers.peer_params import params, run

SOURCE = "tests/test_root_find.py"


@pytest.mark.parametrize("case", params("optimistix", SOURCE))
def test_case(case) -> None:
    run(case)
