"""Theseus's test_gauss_newton (common.py's nonlinear least-squares fit) against GaussNewton.

Source: facebookresearch/theseus, `tests/theseus_tests/optimizer/nonlinear/test_gauss_newton.py`
(the facts: the docstring of `implicit_ham/testing/peer_cases/theseus.py`).
"""

import pytest
from helpers.peer_params import params, run

SOURCE = "tests/theseus_tests/optimizer/nonlinear/test_gauss_newton.py"


@pytest.mark.parametrize("case", params("theseus", SOURCE))
def test_case(case) -> None:
    run(case)
