"""Each arm's fastest measured cost: the studies' projection of their jobs' time on idle cores.

The studies' rows ran under different loads (this 2-core host is shared with other runs and
with test suites), so a row's time says as much about the load as about the job. An arm's
fastest row is the time at the lowest load it met: the pages project idle-core budgets from it,
and say that it still overstates them where every row of an arm ran under load.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any, TypeVar

Arm = TypeVar("Arm", bound=Hashable)


def fastest(
    rows: Iterable[Mapping[str, Any]],
    arm: Callable[[Mapping[str, Any]], Arm],
    cost: Callable[[Mapping[str, Any]], float | None],
) -> dict[Arm, float]:
    """The smallest ``cost(row)`` of each ``arm(row)`` over ``rows``; rows whose cost is None
    (not measured, not ok) are skipped, and an arm with none of them is absent."""
    out: dict[Arm, float] = {}
    for row in rows:
        value = cost(row)
        if value is not None:
            key = arm(row)
            out[key] = min(out.get(key, math.inf), value)
    return out
