"""TorchOpt's test_implicit (iMAML, ridge regression) against minimize's backward modes.

Source: metaopt/torchopt, `tests/test_implicit.py`
(the facts: the docstring of `implicit_ham/testing/peer_cases/torchopt.py`).
"""

import pytest
from helpers.peer_params import params, run

SOURCE = "tests/test_implicit.py"


@pytest.mark.parametrize("case", params("torchopt", SOURCE))
def test_case(case) -> None:
    run(case)
