"""Mixed precision: the dtype small linear-algebra work runs in.

float16 / bfloat16 states are fine for the iterations' matrix products, but the small solves
(the implicit backward's linear solve, Anderson's mixing system, CD's ridge regression, SVD's
QR) are either not implemented for them on the CPU or too inaccurate; they run in float32 and
their results are cast back.
"""

from __future__ import annotations

import torch

LOW_PRECISION = (torch.float16, torch.bfloat16)


def working_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for float16 / bfloat16, ``dtype`` itself otherwise."""
    return torch.float32 if dtype in LOW_PRECISION else dtype
