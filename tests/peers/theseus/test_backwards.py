"""Theseus's test_backwards_quad_fit / test_backwards_quartic against least_squares' backward modes.

Source: facebookresearch/theseus, `tests/theseus_tests/optimizer/nonlinear/test_backwards.py`
(the facts: the docstring of `implicit_ham/testing/peer_cases/theseus.py`).
"""

import pytest
from helpers.peer_params import params, run

SOURCE = "tests/theseus_tests/optimizer/nonlinear/test_backwards.py"


@pytest.mark.parametrize("case", params("theseus", SOURCE))
def test_case(case) -> None:
    run(case)
