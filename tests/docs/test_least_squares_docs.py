"""The ``python least-squares`` blocks of ``docs/optimization_layers.md`` (batched and robust
least squares, unrolled Gauss-Newton) run as written, in order, in one namespace, and print
exactly what the page shows after each of them; the first (float32 at the defaults) without a
warning."""

from __future__ import annotations

import contextlib
import io
import re
import warnings
from pathlib import Path

PAGE = Path(__file__).resolve().parents[2] / "docs" / "optimization_layers.md"
BLOCK = re.compile(
    r"```python least-squares\n(.*?)```\n\nprints[^\n]*\n(?:[^\n]+\n)*?\n?```\n(.*?)```", re.S
)


def test_the_least_squares_examples_print_what_the_page_shows() -> None:
    pairs = BLOCK.findall(PAGE.read_text())
    assert len(pairs) == 2
    namespace: dict[str, object] = {}
    for i, (code, shown) in enumerate(pairs):
        out = io.StringIO()
        with contextlib.redirect_stdout(out), warnings.catch_warnings():
            if i == 0:  # float32 at the defaults: no ConvergenceWarning, no NotFixedPointWarning
                warnings.simplefilter("error")
                warnings.filterwarnings("ignore", category=DeprecationWarning)
            where = f"docs/optimization_layers.md[least-squares {i}]"
            exec(compile(code, where, "exec"), namespace)
        assert out.getvalue() == shown
