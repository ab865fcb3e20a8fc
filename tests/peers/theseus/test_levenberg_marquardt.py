"""Theseus's test_levenberg_marquardt / test_ellipsoidal_damping_compatibility against
LevenbergMarquardt.

Source: facebookresearch/theseus,
`tests/theseus_tests/optimizer/nonlinear/test_levenberg_marquardt.py`
(the facts: the docstring of `implicit_ham/testing/peer_cases/theseus.py`).
"""

import pytest
from helpers.peer_params import params, run

SOURCE = "tests/theseus_tests/optimizer/nonlinear/test_levenberg_marquardt.py"


@pytest.mark.parametrize("case", params("theseus", SOURCE))
def test_case(case) -> None:
    run(case)
