"""The size and shape of the code: ``python -m experiments.code_stats [--write PAGE]``.

Measures what the architecture page states about the repository, from the source itself:

* lines of code (non-blank, non-comment) and files of ``implicit_ham/`` and ``experiments/``
  (tests excluded) and of their sub-packages;
* functions longer than 60 lines and functions with more than 6 parameters (``self`` / ``cls``
  not counted), per package;
* the public names of ``implicit_ham`` (its ``__all__``);
* imports from ``experiments`` into the library's private modules (``implicit_ham._*``);
* the files and functions of the library that one ``fixed_point`` + ``Anderson`` + ``Implicit``
  call (forward and backward) runs, traced with ``sys.setprofile``.

``--write PAGE`` replaces the block between ``<!-- code-stats:start -->`` and
``<!-- code-stats:end -->`` in PAGE (docs/architecture.md); without it the block is printed.
``tests/experiments/test_code_stats.py`` checks that the page holds the current block.
"""

from __future__ import annotations

import argparse
import ast
import io
import sys
import tokenize
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from experiments.reports.render import replace_between
from implicit_ham.diagnostics.table import markdown_table

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("implicit_ham", "experiments")
START, END = "<!-- code-stats:start -->", "<!-- code-stats:end -->"
LONG_FUNCTION = 60
MANY_PARAMETERS = 6


@dataclass(frozen=True)
class FileStats:
    """One module: its lines of code and the functions over the limits (``name:line`` each)."""

    path: Path
    code_lines: int
    long_functions: tuple[str, ...]
    many_parameters: tuple[str, ...]
    private_imports: int


def code_lines(source: str) -> int:
    """Lines holding at least one token that is not a comment, a newline or an indent."""
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT}
    lines: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in skip and token.type != tokenize.ENDMARKER:
            lines.update(range(token.start[0], token.end[0] + 1))
    return len(lines)


def _functions(tree: ast.AST) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node


def parameter_count(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Parameters of a function, ``*args`` / ``**kwargs`` included, ``self`` / ``cls`` not."""
    a = node.args
    names = [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
    names += [p.arg for p in (a.vararg, a.kwarg) if p is not None]
    return len([n for n in names if n not in ("self", "cls")])


def _private_imports(tree: ast.AST) -> int:
    count = 0
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        count += sum(n.startswith("implicit_ham._") for n in names)
    return count


def file_stats(path: Path) -> FileStats:
    """Measure one module."""
    source = path.read_text()
    tree = ast.parse(source)
    long_, many = [], []
    for fn in _functions(tree):
        length = (fn.end_lineno or fn.lineno) - fn.lineno + 1
        if length > LONG_FUNCTION:
            long_.append(f"{fn.name}:{fn.lineno}")
        if parameter_count(fn) > MANY_PARAMETERS:
            many.append(f"{fn.name}:{fn.lineno}")
    return FileStats(path, code_lines(source), tuple(long_), tuple(many), _private_imports(tree))


def package_stats(package: str) -> list[FileStats]:
    """Every module of a package, sorted by path."""
    return [file_stats(p) for p in sorted((ROOT / package).rglob("*.py"))]


def traced_call() -> tuple[int, int]:
    """(files, functions) of ``implicit_ham`` run by a fixed_point + Anderson + Implicit call,
    forward and backward, on a small contractive tanh map (after one warm-up call)."""
    import torch

    import implicit_ham as ih

    weight = torch.randn(16, 16, generator=torch.Generator().manual_seed(0)) * 0.05

    def run() -> None:
        x = torch.randn(4, 16, generator=torch.Generator().manual_seed(1), requires_grad=True)
        sol = ih.fixed_point(
            lambda z, x: torch.tanh(z @ weight.T + x), torch.zeros(4, 16), x,
            solver=ih.Anderson(max_steps=20, tol=1e-6), adjoint=ih.Implicit(),
        )
        cast(torch.Tensor, sol.value).sum().backward()  # z0 is one tensor, so is the value

    run()
    package = str(ROOT / "implicit_ham")
    seen: set[tuple[str, str, int]] = set()

    def profile(frame: Any, event: str, _arg: Any) -> None:
        code = frame.f_code
        if event == "call" and code.co_filename.startswith(package):
            seen.add((code.co_filename, code.co_name, code.co_firstlineno))

    hook: Callable[..., Any] = profile
    sys.setprofile(hook)
    try:
        run()
    finally:
        sys.setprofile(None)
    return len({f for f, _, _ in seen}), len(seen)


HEADER = ("package", "files", "code lines", "functions > 60 lines", "functions > 6 parameters")


def _row(name: str, files: list[FileStats]) -> tuple[str, int, int, int, int]:
    return (
        f"`{name}`", len(files), sum(f.code_lines for f in files),
        sum(len(f.long_functions) for f in files), sum(len(f.many_parameters) for f in files),
    )  # fmt: skip


def _subpackages(package: str, files: list[FileStats]) -> list[tuple[str, int, int, int, int]]:
    groups: dict[str, list[FileStats]] = {}
    for f in files:
        parts = f.path.relative_to(ROOT / package).parts
        key = f"{package}/{parts[0]}" if len(parts) > 1 else f"{package} (top level)"
        groups.setdefault(key, []).append(f)
    return [_row(key, groups[key]) for key in sorted(groups)]


def block() -> str:
    """The markdown block the architecture page holds between its markers."""
    import implicit_ham as ih

    stats = {p: package_stats(p) for p in PACKAGES}
    lib, exp = (sum(f.code_lines for f in stats[p]) for p in PACKAGES)
    files, functions = traced_call()
    lines = [START, "", markdown_table(HEADER, [_row(p, stats[p]) for p in PACKAGES])]
    lines += [
        "",
        f"- `experiments/` is {exp / lib:.2f}× the library's code lines ({exp} vs {lib}; "
        "tests excluded; comment and blank lines not counted).",
        f"- `implicit_ham` exports {len(ih.__all__)} public names.",
        f"- `experiments/` imports the library's private modules (implicit_ham._core and the like) "
        f"{sum(f.private_imports for f in stats['experiments'])} times.",
        f"- One `fixed_point` + `Anderson` + `Implicit` call (forward and backward) runs "
        f"{functions} functions in {files} files of the library.",
        "",
        "<details><summary>Per sub-package</summary>",
        "",
        markdown_table(
            HEADER,
            _subpackages("implicit_ham", stats["implicit_ham"])
            + _subpackages("experiments", stats["experiments"]),
        ),
        "",
        "</details>",
        "",
        END,
    ]
    return "\n".join(lines)


def replace_block(page_text: str, new_block: str) -> str:
    """``page_text`` with the block between the markers replaced by ``new_block``."""
    return replace_between(page_text, new_block, START, END)


def main(argv: list[str] | None = None) -> None:
    """Print the block, or write it into the page named by ``--write``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", type=Path, help="the page whose block to replace")
    args = parser.parse_args(argv)
    new_block = block()
    if args.write is None:
        sys.stdout.write(new_block + "\n")
        return
    args.write.write_text(replace_block(args.write.read_text(), new_block))


if __name__ == "__main__":
    main()
