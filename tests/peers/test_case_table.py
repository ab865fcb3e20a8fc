"""The peer case table itself: every case names a peer, a source test and a reason; names are
unique; every peer has cases; a not-applicable case is listed with its reason, and the kit's
report counts it as not applicable with that reason (never dropped)."""

from implicit_ham.testing.peer_cases import PEERS, all_cases, run_cases


def test_every_case_is_named_sourced_and_explained() -> None:
    cases = all_cases()
    names = [c.name for c in cases]
    assert len(names) == len(set(names)), "duplicate case names"
    for case in cases:
        assert case.peer in PEERS
        assert case.source.startswith("tests/") and "::" in case.source, case.source
        assert case.reason, f"{case.name} has no reason"
    for peer in PEERS:
        assert any(c.peer == peer and c.applicable for c in cases), peer


def test_not_applicable_cases_are_reported_with_their_reason() -> None:
    listed = [c for c in all_cases() if not c.applicable]
    assert listed
    report = run_cases(listed)
    assert len(report.not_applicable) == len(listed) and not report.passed and not report.failed
    assert [r.detail for r in report.not_applicable] == [c.reason for c in listed]
    assert report.ok and not report.skipped  # by design, not a check the kit failed to run
