"""The sweep report's labels, columns and metric selection (issue 45 items 4 and 5; issue 47
item 7(c)): only the overrides that differ between arms label them, every logged metric can be
tabulated and an unknown one is an error, and an ok job without a value is shown as missing."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg

from experiments.reports.plots import bar_figure
from experiments.reports.sweep import arm_keys, common_overrides, label, metrics_table, write_report
from experiments.reports.sweep_jobs import collect_jobs, group_jobs
from experiments.reports.sweep_metrics import UnknownMetricError

ROOT = Path(__file__).resolve().parents[3]
COMMON = ["threads=1", "data.train_size=16", "context.rank=4", "progress=False"]


def _job(root: Path, num: int, overrides: list[str], metrics: dict, rows: list[dict]) -> Path:
    job = root / str(num)
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    body = {"status": "ok", "metrics": metrics, "train_time_s": 1.0}
    (job / "results.json").write_text(json.dumps(body))
    (job / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return job


@pytest.fixture()
def sweep(tmp_path: Path) -> Path:
    """Two arms (adjoint, a long solver override) x two seeds, the same four other overrides
    in every job; each job logs a gradient norm per step (last one known)."""
    arms = {"unroll": "solver.max_steps=7", "implicit": "solver.max_steps=30"}
    for num, (adjoint, seed) in enumerate([(a, s) for a in arms for s in (0, 1)]):
        rows = [
            {"step": 0, "grad_norm/global": 10.0 + num, "backward/ham/steps": 3},
            {"step": 1, "grad_norm/global": 1.0 + num, "backward/ham/steps": 5 + num},
            {"step": 2, "epoch": 1, "val/blob_acc": 0.5},
        ]
        metrics = {"val/blob_acc": 0.25 * (num + 1), "val/loss": 1.0}
        _job(tmp_path, num, [*COMMON, f"adjoint={adjoint}", arms[adjoint], f"seed={seed}"],
             metrics, rows)  # fmt: skip
    return tmp_path


def test_only_the_overrides_that_differ_label_the_arms(sweep: Path) -> None:
    rows = group_jobs(collect_jobs(sweep))
    assert arm_keys(rows) == ["adjoint", "solver.max_steps"]
    assert common_overrides(rows) == {
        "context.rank": "4", "data.train_size": "16", "progress": "False", "threads": "1"
    }  # fmt: skip
    lines = metrics_table(rows, ["val/blob_acc"]).markdown().splitlines()
    assert lines[0] == "| adjoint | solver.max_steps | n | val/blob_acc |"
    assert lines[2] == "| unroll | 7 | 2/2 | 0.375 ± 0.177 |"
    assert label(rows[1].overrides, arm_keys(rows)) == "adjoint=implicit max_steps=30"
    text = write_report(sweep, sweep / "out").read_text()
    assert ("Common to every job: `context.rank=4 data.train_size=16 progress=False "
            "threads=1`.") in text  # fmt: skip
    assert text.count("threads=1") == 1  # stated once, in no label or column


def test_short_names_that_collide_keep_their_full_key(tmp_path: Path) -> None:
    for num, (a, b) in enumerate([(1, 2), (3, 4)]):
        _job(tmp_path, num, [f"context.steps={a}", f"study.steps={b}"], {"val/loss": 1.0}, [])
    rows = group_jobs(collect_jobs(tmp_path))
    assert label(rows[0].overrides, arm_keys(rows)) == "context.steps=1 study.steps=2"


def test_bar_plot_labels_are_the_differing_overrides_and_fit_the_figure(tmp_path: Path) -> None:
    long = "x" * 60
    for num, name in enumerate(["a", long]):
        _job(tmp_path, num, [*COMMON, f"+arm={name}"], {"val/blob_acc": 0.5}, [])
    rows = group_jobs(collect_jobs(tmp_path))
    fig = bar_figure(rows, "val/blob_acc", arm_keys(rows))
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    ticks = fig.axes[0].get_yticklabels()
    assert [t.get_text() for t in ticks] == ["arm=a", f"arm={long}"]
    renderer = canvas.get_renderer()
    figure_box = fig.bbox
    for tick in ticks:  # the whole label is drawn inside the figure, nothing clipped
        box = tick.get_window_extent(renderer)
        assert box.x0 >= figure_box.x0 and box.x1 <= figure_box.x1


def test_every_logged_metric_can_be_tabulated(sweep: Path) -> None:
    rows = group_jobs(collect_jobs(sweep))
    table = metrics_table(rows, ["grad_norm/global", "backward/ham/steps", "train_time_s"])
    lines = table.markdown().splitlines()
    # the last logged value of each job: 1 + num; steps 5 + num
    norms = statistics.fmean([1.0, 2.0]), statistics.stdev([1.0, 2.0])
    assert lines[2] == (f"| unroll | 7 | 2/2 | {norms[0]:.3f} ± {norms[1]:.3f} | "
                        "5.500 ± 0.707 | 1.000 ± 0.000 |")  # fmt: skip


def test_an_unknown_metric_is_an_error_naming_the_closest_and_the_available(
    sweep: Path,
) -> None:
    rows = group_jobs(collect_jobs(sweep))
    with pytest.raises(UnknownMetricError) as err:
        metrics_table(rows, ["val/blob_accc"])
    message = str(err.value)
    assert "'val/blob_accc' (did you mean 'val/blob_acc'" in message
    for name in ("grad_norm/global", "backward/ham/steps", "val/loss", "train_time_s"):
        assert name in message
    out = sweep / "refused"
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.report", str(sweep), "--out", str(out),
         "--metrics", "val/blob_accc"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "did you mean 'val/blob_acc'" in proc.stderr
    assert not out.exists()  # refused before anything is written


def test_an_ok_job_without_a_value_is_counted_as_missing(tmp_path: Path) -> None:
    for num, value in enumerate([0.5, None, 0.7]):
        _job(tmp_path, num, ["+arm=a", f"seed={num}"], {"val/blob_acc": value}, [])
    lines = metrics_table(group_jobs(collect_jobs(tmp_path)), ["val/blob_acc"])
    cells = lines.markdown().splitlines()[2]
    assert cells == "| 3/3 | 0.600 ± 0.141 (n=2, 1 missing) |"
