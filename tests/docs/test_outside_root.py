"""The experiments work from any directory, not only the repository root (issue 45 item 7):
``experiments`` is installed with the library (``pyproject.toml``'s packages), so
``python -m experiments.train`` finds its Hydra configs (the checkout's ``conf/``) and the docs'
``from experiments.engine... import ...`` examples run from elsewhere. Each check runs the
interpreter of the tests in a fresh process from a temporary directory, without ``PYTHONPATH``.

The checks need the interpreter's install to be of this checkout (``make install``); when it
is of another one (a shared environment installed from elsewhere), they are skipped, saying so.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _python_blocks(text: str) -> list[tuple[int, str]]:
    """``python_blocks`` of ``test_docs_examples`` (the docs tests' own block finder)."""
    spec = importlib.util.spec_from_file_location("docs_examples", Path(__file__).with_name(
        "test_docs_examples.py"))  # fmt: skip
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.python_blocks(text)


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(WANDB_MODE="offline", OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300, check=False)  # fmt: skip


@pytest.fixture(scope="module")
def outside(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory outside the checkout, once the install is known to be of this checkout."""
    cwd = tmp_path_factory.mktemp("elsewhere")
    found = _run(["-c", "import implicit_ham; print(implicit_ham.__file__)"], cwd)
    assert found.returncode == 0, f"implicit_ham is not installed: {found.stderr[-2000:]}"
    installed = Path(found.stdout.strip()).resolve().parents[1]
    if installed != ROOT:
        pytest.skip(f"the interpreter's implicit-ham install is of {installed}, not of {ROOT}; "
                    "run make install in this checkout to check it from outside")  # fmt: skip
    return cwd


def test_experiments_are_installed_with_the_library(outside: Path) -> None:
    found = _run(["-c", "import experiments; print(experiments.__file__)"], outside)
    assert found.returncode == 0, (
        f"experiments is not importable outside the checkout ({found.stderr[-1000:]}); "
        "pyproject.toml's packages must include experiments*, then make install"
    )
    assert Path(found.stdout.strip()).resolve() == ROOT / "experiments" / "__init__.py"


@pytest.mark.slow
def test_the_training_command_finds_its_configs_from_another_directory(outside: Path) -> None:
    proc = _run(["-m", "experiments.train", "--cfg", "job", "optim.lr=0.01"], outside)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "lr: 0.01" in proc.stdout and "context:" in proc.stdout


@pytest.mark.slow
def test_the_diagnostics_page_runs_from_another_directory(outside: Path) -> None:
    page = ROOT / "docs" / "diagnostics.md"
    code = "\n".join(block for _, block in _python_blocks(page.read_text()))
    assert "from experiments.engine.file_sinks import" in code
    (outside / "page.py").write_text(code)
    proc = _run(["page.py"], outside)
    assert proc.returncode == 0, proc.stderr[-3000:]
