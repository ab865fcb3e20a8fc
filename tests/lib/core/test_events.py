"""The event ledger: every event counted, the first shown in full, then one summary per
``every`` events; the active warning filters take precedence."""

from __future__ import annotations

import warnings

import pytest

from implicit_ham._core.events import EventLedger, event_source, filter_action


class Demo(UserWarning):
    pass


def _emit(ledger: EventLedger, n: int, residual: float = 1.0, source: str = "layer") -> list:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        for i in range(n):
            ledger.warn(f"event {i}", Demo, residual=residual * (i + 1), source=source)
    return [w for w in caught if issubclass(w.category, Demo)]


def test_the_first_event_then_one_summary_per_period() -> None:
    ledger = EventLedger(every=40)
    shown = _emit(ledger, 100)
    assert len(shown) == 3  # events 1, 40, 80
    assert str(shown[0].message) == "event 0"
    assert "39 more Demo events from layer" in str(shown[1].message)
    assert "worst residual 4.000e+01" in str(shown[1].message)
    assert ledger.summary() == {
        "total": 100,
        "by_kind": {"Demo": 100},
        "by_source": {"layer": {"Demo": 100}},
        "worst_residual": {"Demo": 100.0},
    }


def test_sources_are_counted_apart_and_scopes_name_them() -> None:
    ledger = EventLedger(every=10)
    _emit(ledger, 3, source="a")
    with warnings.catch_warnings(record=True) as caught, event_source("block.ham"):
        warnings.simplefilter("default")
        ledger.warn("x", Demo)
    assert len(caught) == 1  # a new source: shown in full
    assert ledger.counts() == {"a": {"Demo": 3}, "block.ham": {"Demo": 1}}
    ledger.reset()
    assert ledger.summary()["total"] == 0


@pytest.mark.parametrize(("action", "shown"), [("always", 5), ("ignore", 0)])
def test_the_active_filter_takes_precedence(action: str, shown: int) -> None:
    ledger = EventLedger(every=100)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter(action, Demo)
        for _ in range(5):
            ledger.warn("e", Demo)
    assert len(caught) == shown
    assert ledger.summary()["total"] == 5
    with warnings.catch_warnings():
        warnings.simplefilter("error", Demo)
        with pytest.raises(Demo):
            ledger.warn("e", Demo)


def test_filter_action_reads_message_filters() -> None:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="noisy", category=Demo)
        assert filter_action(Demo, "noisy solver") == "ignore"
        assert filter_action(Demo, "quiet") != "ignore"


def test_bad_period_is_refused() -> None:
    with pytest.raises(ValueError, match="every must be an int >= 1"):
        EventLedger(every=0)
