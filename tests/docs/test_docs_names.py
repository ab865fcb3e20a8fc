"""The README and the docs pages name only things that exist: every dotted name under ``ih.``,
``implicit_ham.`` or ``experiments.`` resolves (module by import, the rest by attribute), every
repository path under ``implicit_ham/``, ``experiments/``, ``tests/``, ``docs/`` or ``conf/``
exists, every ``tests/...py::test_name`` is defined in that file, and every
``python -m experiments.<module>`` command names a module. A rename that misses a page fails here
with the page and line.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

NAME = re.compile(r"(?<![\w./-])(ih|implicit_ham|experiments)((?:\.[A-Za-z_]\w*)+)")
FILE_SUFFIX = re.compile(r"\.(md|py|sh|ya?ml|json|jsonl|csv|png|pt|txt)$")  # a file, not a name
PATH = re.compile(r"(?<![\w./-])((?:implicit_ham|experiments|tests|docs|conf)/[\w./-]*\w)")
TEST_ID = re.compile(r"(tests/[\w/]+\.py)::(\w+)")
COMMAND = re.compile(r"-m (experiments(?:\.\w+)+)")


def resolves(dotted: str) -> bool:
    """Whether ``dotted`` is a module, or an attribute chain below the longest module prefix."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[cut:]:
            if not hasattr(obj, attribute):
                return False
            obj = getattr(obj, attribute)
        return True
    return False


def problems(text: str) -> list[str]:
    """Every reference in ``text`` that does not exist, as ``line N: what``."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for match in NAME.finditer(line):
            if line[: match.start()].endswith("-m "):
                continue  # a command: checked below
            dotted = "implicit_ham" + match.group(2) if match.group(1) == "ih" else match.group(0)
            if not FILE_SUFFIX.search(dotted) and not resolves(dotted):
                found.append(f"line {number}: no such name {match.group(0)}")
        for match in PATH.finditer(line):
            if not (ROOT / match.group(1)).exists():
                found.append(f"line {number}: no such path {match.group(1)}")
        for match in TEST_ID.finditer(line):
            test_file = ROOT / match.group(1)
            if test_file.is_file() and f"def {match.group(2)}(" not in test_file.read_text():
                found.append(f"line {number}: no test {match.group(2)} in {match.group(1)}")
        for match in COMMAND.finditer(line):
            if importlib.util.find_spec(match.group(1)) is None:
                found.append(f"line {number}: no command module {match.group(1)}")
    return found


def test_the_checker_reports_what_does_not_exist() -> None:
    text = (
        "`ih.linalg.GMRES` and `implicit_ham.problems.root` exist; see experiments.md\n"
        "`ih.GMRES`, `implicit_ham.training.rng`, `experiments.engine.no_such_thing`\n"
        "`tests/lib/no_such_test.py`, `tests/docs/test_docs_names.py::test_no_such_test`\n"
        "python -m experiments.no_such_command\n"
    )
    assert problems(text) == [
        "line 2: no such name ih.GMRES",
        "line 2: no such name implicit_ham.training.rng",
        "line 2: no such name experiments.engine.no_such_thing",
        "line 3: no such path tests/lib/no_such_test.py",
        "line 3: no test test_no_such_test in tests/docs/test_docs_names.py",
        "line 4: no command module experiments.no_such_command",
    ]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_page_names_only_what_exists(page: Path) -> None:
    found = problems(page.read_text(encoding="utf-8"))
    assert not found, f"{page.relative_to(ROOT)}:\n" + "\n".join(found)
