"""Theseus's common.py singular-linearisation check (listed: not applicable).

Source: facebookresearch/theseus, `tests/theseus_tests/optimizer/nonlinear/common.py`
(the facts: the docstring of `implicit_ham/testing/peer_cases/theseus.py`).
"""

import pytest
from helpers.peer_params import params, run

SOURCE = "tests/theseus_tests/optimizer/nonlinear/common.py"


@pytest.mark.parametrize("case", params("theseus", SOURCE))
def test_case(case) -> None:
    run(case)
