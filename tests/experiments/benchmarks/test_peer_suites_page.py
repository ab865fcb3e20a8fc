"""docs/peer_suites.md is written from the JSON alone: per-peer counts, the worst gradient error,
each case that does not pass with its reason, and the MGH counts beside SciPy."""

from pathlib import Path

from experiments.benchmarks.peer_suites_page import write_page


def _case(peer: str, name: str, status: str, detail: str, grad: float | None = None) -> dict:
    measured = {} if grad is None else {"grad_error": grad}
    return {
        "peer": peer,
        "source": f"tests/t.py::{name}",
        "name": name,
        "status": status,
        "detail": detail,
        "measured": measured,
        "expected_failure": "",
        "seconds": 0.1,
    }


def _mgh(problem: str, method: str, solved: bool, f: float) -> dict:
    return {
        "problem": problem,
        "number": 1,
        "n": 2,
        "method": method,
        "dtype": "float64",
        "f": f,
        "fstar": 0.0,
        "solved": solved,
        "local": False,
        "evaluations": 10,
        "jacobians": 0,
        "seconds": 0.01,
        "note": "max_steps" if not solved else "",
    }


def test_page_counts_and_reasons(tmp_path: Path) -> None:
    data = {
        "peer_cases": [
            _case("jaxopt", "a", "passed", "mapped", 2e-6),
            _case("jaxopt", "b", "failed", "off by 3", 0.5),
            _case("jaxopt", "c", "not applicable", "has_aux: no counterpart"),
        ],
        "mgh": [
            _mgh("rosenbrock", "ours least_squares (LevenbergMarquardt)", True, 0.0),
            _mgh("meyer", "ours least_squares (LevenbergMarquardt)", False, 1.5e4),
            _mgh("rosenbrock", "scipy lm", True, 0.0),
            _mgh("meyer", "scipy lm", True, 87.9),
        ],
        "mgh_tau": {"float64": 1e-6, "float32": 1e-4},
        "meta": {"torch": "x"},
    }
    page = tmp_path / "p.md"
    write_page(data, page)
    text = page.read_text()
    assert "| jaxopt | google/jaxopt | 3 | 2 | 1 | 1 | 1 | 0.5 |" in text
    assert "`c` (not applicable): has_aux: no counterpart" in text
    assert "`b` (failed): off by 3" in text
    assert "| ours LM | float64 | 2 | 1 | 0 | 1 |" in text
    assert "| scipy lm | float64 | 2 | 2 | 0 | 0 |" in text
    assert "- meyer, ours LM: f = 1.5e+04 (f* = 0); max_steps" in text


def test_committed_page_is_the_committed_json_rendered(tmp_path: Path) -> None:
    """docs/peer_suites.md is exactly what ``page`` writes from docs/peer_suites/results.json
    (never hand-edited), and the JSON lists every peer case there is now."""
    import json

    from experiments.benchmarks.peer_suites import DEFAULT_JSON, DEFAULT_PAGE
    from implicit_ham.testing.peer_cases import all_cases

    data = json.loads(DEFAULT_JSON.read_text())
    page = tmp_path / "page.md"
    write_page(data, page)
    assert page.read_text() == DEFAULT_PAGE.read_text()
    assert [r["name"] for r in data["peer_cases"]] == [c.name for c in all_cases()]
