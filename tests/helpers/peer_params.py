"""pytest parameters for the peers' cases (``implicit_ham.testing.peer_cases``): one parameter per
case of a peer's test file, marked ``slow`` where the case says so, ``xfail(strict=True)`` with
its reason where it exposes a known defect, and skipped with its reason where it has no
counterpart here (listed, never dropped)."""

from __future__ import annotations

import pytest

from implicit_ham.testing.peer_cases import PeerCase, all_cases, run_case


def params(peer: str, source_file: str) -> list[object]:
    """The cases of ``peer`` whose source is ``source_file`` (a path ending), as parameters."""
    out = []
    for case in all_cases():
        if case.peer != peer or not case.source_file.endswith(source_file):
            continue
        marks = []
        if case.slow:
            marks.append(pytest.mark.slow)
        if case.expected_failure:
            marks.append(pytest.mark.xfail(strict=True, reason=case.expected_failure))
        if not case.applicable:
            marks.append(pytest.mark.skip(reason=f"not applicable: {case.reason}"))
        out.append(pytest.param(case, id=case.name, marks=marks))
    assert out, f"no {peer} cases from {source_file}"
    return out


def run(case: PeerCase) -> None:
    """Run the case with the peer's solver mapped to ours; a failure is an AssertionError with
    the case, its source and the measured numbers."""
    from implicit_ham.testing.report import CheckFailedError

    try:
        run_case(case)
    except CheckFailedError as failure:
        raise AssertionError(f"{case.source} ({case.name}): {failure} {failure.measured}") from None
