"""The API reference covers the API: every public namespace of ``implicit_ham`` (the package and
each of its modules or sub-packages not named ``_*``) has a page in the built site, and that page
documents exactly the names of the namespace's ``__all__``, no fewer and no more (no internals).

The built site is ``site/`` (mkdocs' ``site_dir``; ``make test`` builds it before pytest) when it
is newer than every docs source and library module; otherwise the test builds the docs itself
(``mkdocs build --strict``, about 20 s) into a temporary folder.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import subprocess
import sys
import types
from html.parser import HTMLParser
from pathlib import Path

import pytest

import implicit_ham

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = implicit_ham.__name__


def namespaces() -> list[str]:
    """``implicit_ham`` and every public module / sub-package directly under it."""
    found = [
        f"{PACKAGE}.{info.name}"
        for info in pkgutil.iter_modules(implicit_ham.__path__)
        if not info.name.startswith("_")
    ]
    return [PACKAGE, *sorted(found)]


def page_of(namespace: str) -> Path:
    """The page of ``namespace`` relative to the site: ``api/<last part>/index.html``."""
    return Path("api", namespace.rsplit(".", 1)[-1], "index.html")


class Headings(HTMLParser):
    """The ids of mkdocstrings' object headings (``class="doc doc-heading"``) by level, and the
    targets of every link."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: dict[int, list[str]] = {}
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        if tag == "a" and attributes.get("href"):
            self.hrefs.append(str(attributes["href"]))
        classes = (attributes.get("class") or "").split()
        if len(tag) == 2 and tag[0] == "h" and tag[1].isdigit() and "doc-heading" in classes:
            self.ids.setdefault(int(tag[1]), []).append(str(attributes.get("id")))


def read_headings(html: str) -> Headings:
    """Parse a built page."""
    parser = Headings()
    parser.feed(html)
    return parser


def documented_names(html: str, namespace: str) -> set[str]:
    """The names a namespace page documents at the top level: its h2 object headings (the h1 is
    the namespace itself; h3 and below are members of classes)."""
    headings = read_headings(html)
    assert headings.ids.get(1) == [namespace], f"the page's h1 is not {namespace}: {headings.ids}"
    prefix = f"{namespace}."
    return {id_.removeprefix(prefix) for id_ in headings.ids.get(2, []) if id_.startswith(prefix)}


def public_names(namespace: str) -> tuple[set[str], set[str]]:
    """(names that are not modules, names that are modules) of ``namespace.__all__``."""
    module = importlib.import_module(namespace)
    names = set(module.__all__)
    modules = {name for name in names if isinstance(getattr(module, name), types.ModuleType)}
    return names - modules, modules


def newest_source_mtime() -> float:
    """The latest modification time of what the reference is built from."""
    sources = [ROOT / "mkdocs.yml", *(ROOT / "docs").rglob("*"), *(ROOT / PACKAGE).rglob("*.py")]
    return max(path.stat().st_mtime for path in sources if path.is_file())


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A built site: ``site/`` when it is up to date, otherwise a fresh strict build."""
    built = ROOT / "site"
    stamp = built / page_of(PACKAGE)
    if stamp.is_file() and stamp.stat().st_mtime > newest_source_mtime():
        return built
    target = tmp_path_factory.mktemp("site")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-d", str(target)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stderr}"
    return target


def test_the_namespaces_are_the_documented_ones() -> None:
    """The namespaces found are the ones docs/architecture.md lists (a guard on the discovery:
    a namespace that moved under ``_core`` would drop out silently)."""
    documented = "linalg plugins errors diagnostics reliability testing"
    layers = "solvers adjoints problems nn decompositions"
    expected = {f"{PACKAGE}.{name}" for name in f"{documented} {layers}".split()}
    assert set(namespaces()) >= expected


def test_the_heading_reader_sees_a_missing_and_an_extra_name() -> None:
    html = (
        '<h1 id="pkg.ns" class="doc doc-heading">ns</h1>'
        '<h2 id="pkg.ns.A" class="doc doc-heading">A</h2>'
        '<h3 id="pkg.ns.A.method" class="doc doc-heading">method</h3>'
        '<h2 id="pkg.ns.helper" class="doc doc-heading">helper</h2>'
        '<h2 id="prose">not an object</h2>'
    )
    assert documented_names(html, "pkg.ns") == {"A", "helper"}


@pytest.mark.parametrize("namespace", namespaces())
def test_every_public_name_is_on_its_namespace_page(site: Path, namespace: str) -> None:
    page = site / page_of(namespace)
    assert page.is_file(), f"no API page for {namespace}: add docs/api/{page.parent.name}.md"
    expected, _ = public_names(namespace)
    documented = documented_names(page.read_text(encoding="utf-8"), namespace)
    assert not expected - documented, (
        f"{namespace}: not documented: {sorted(expected - documented)}"
    )
    assert not documented - expected, (
        f"{namespace}: not in __all__: {sorted(documented - expected)}"
    )


@pytest.mark.parametrize("namespace", namespaces())
def test_every_sub_namespace_has_a_page_linked_from_its_parent(site: Path, namespace: str) -> None:
    _, modules = public_names(namespace)
    links = read_headings((site / page_of(namespace)).read_text(encoding="utf-8")).hrefs
    for name in sorted(modules):
        child = f"{namespace}.{name}"
        assert (site / page_of(child)).is_file(), f"no API page for {child}"
        assert any(href.endswith(f"#{child}") for href in links), (
            f"{namespace} does not link {child}"
        )


def test_the_overview_links_every_namespace_page(site: Path) -> None:
    links = read_headings((site / "api" / "index.html").read_text(encoding="utf-8")).hrefs
    for namespace in namespaces():
        target = page_of(namespace).parent.name + "/"
        assert target in links, f"docs/api/index.md does not link the {namespace} page"
