"""experiments.report on a synthetic multirun directory: known numbers in, known table out."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

import implicit_ham as ih
from experiments.reports.sweep import arms_table, metrics_table, write_report
from experiments.reports.sweep_jobs import collect_jobs, group_jobs
from implicit_ham.reliability import ACTION_MEANINGS, FAILURE_MEANINGS


def _job(
    root: Path, num: int, overrides: list[str], metrics: dict | None, error: str | None = None
) -> None:
    job = root / str(num)
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    if metrics is not None:
        body = {"status": "ok", "metrics": metrics, "train_time_s": 1.0}
        if error is not None:
            body = {"status": "failed", "error": error}
        (job / "results.json").write_text(json.dumps(body))
        rows = [
            {"step": e, "epoch": e, "val/blob_acc": metrics["val/blob_acc"] * e / 2} for e in (1, 2)
        ]
        (job / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture()
def sweep(tmp_path: Path) -> Path:
    values = {("unroll", 0): 0.5, ("unroll", 1): 0.7, ("implicit", 0): 0.9, ("implicit", 1): 0.8}
    for num, ((adjoint, seed), value) in enumerate(values.items()):
        _job(
            tmp_path,
            num,
            [f"adjoint={adjoint}", f"seed={seed}"],
            {"val/blob_acc": value, "val/miou": value / 2},
        )
    _job(
        tmp_path,
        4,
        ["adjoint=neumann", "seed=0"],
        {"val/blob_acc": 0.0},
        error="RuntimeError: diverged",
    )
    _job(tmp_path, 5, ["adjoint=phantom", "seed=0"], None)
    return tmp_path


def test_groups_average_over_seeds_only(sweep: Path) -> None:
    rows = group_jobs(collect_jobs(sweep))
    by_adjoint = {row.overrides["adjoint"]: row for row in rows}
    assert set(by_adjoint) == {"unroll", "implicit", "neumann", "phantom"}
    stats = by_adjoint["unroll"].mean_std("val/blob_acc")
    assert stats is not None
    mean, std = stats
    assert mean == pytest.approx(0.6) and std == pytest.approx(statistics.stdev([0.5, 0.7]))
    assert by_adjoint["neumann"].mean_std("val/blob_acc") is None


def test_markdown_table_has_known_cells(sweep: Path) -> None:
    table = metrics_table(group_jobs(collect_jobs(sweep)), metrics=["val/blob_acc", "val/miou"])
    lines = table.markdown().splitlines()
    assert lines[0] == "| adjoint | n | val/blob_acc | val/miou |"
    assert "| unroll | 2/2 | 0.600 ± 0.141 | 0.300 ± 0.071 |" in lines
    assert "| implicit | 2/2 | 0.850 ± 0.071 | 0.425 ± 0.035 |" in lines
    assert "| neumann | 0/1 | – | – |" in lines


def test_report_lists_failed_and_missing_jobs_and_writes_plots(sweep: Path, tmp_path: Path) -> None:
    out = tmp_path / "report"
    path = write_report(sweep, out)
    text = path.read_text()
    assert "RuntimeError: diverged" in text and "no results.json" in text
    for name in ("val_blob_acc.png", "val_blob_acc_curves.png", "val_miou.png"):
        assert (out / name).stat().st_size > 1000


def test_missing_sweep_directory_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="multirun"):
        collect_jobs(tmp_path / "nope")


def _results(root: Path, num: int, arm: str, body: dict) -> Path:
    job = root / str(num)
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "overrides.yaml").write_text(f"- +arm={arm}\n")
    (job / "results.json").write_text(json.dumps({"status": "ok", "train_time_s": 2.0, **body}))
    return job


def test_one_unreadable_file_is_named_and_the_rest_still_reported(tmp_path: Path) -> None:
    good = _results(tmp_path, 0, "a", {"metrics": {"val/blob_acc": 0.5}})
    (good / "metrics.jsonl").write_text('{"epoch": 1, "val/blob_acc": 0.5}\nnot json\n[1]\n')
    bad = _results(tmp_path, 1, "b", {})
    (bad / "results.json").write_text('{"status": "ok", "metr')
    _results(tmp_path, 2, "c", {"metrics": {"val/blob_acc": 0.75}})
    text = write_report(tmp_path, tmp_path / "out").read_text()
    assert "## Files that could not be read" in text
    assert f"{bad / 'results.json'} is not valid JSON" in text
    assert f"{good / 'metrics.jsonl'}: line(s) 2, 3 are not JSON objects" in text
    assert "| a | 1/1 | 0.500 |" in text
    assert "| c | 1/1 | 0.750 |" in text
    assert "| b | 0/1 | – |" in text
    jobs = {job.directory.name: job for job in collect_jobs(tmp_path)}
    assert jobs["1"].status == "unreadable" and [r["epoch"] for r in jobs["0"].history] == [1]


def test_one_seed_shows_no_spread(tmp_path: Path) -> None:
    _results(tmp_path, 0, "single", {"metrics": {"val/blob_acc": 0.25}})
    table = metrics_table(group_jobs(collect_jobs(tmp_path)), metrics=["val/blob_acc"])
    assert "| 1/1 | 0.250 |" in table.markdown().splitlines()  # one arm: no column tells apart
    assert "±" not in table.markdown()  # several seeds: test_markdown_table_has_known_cells


def test_each_arm_is_described_by_the_config_values_that_differ(tmp_path: Path) -> None:
    common = {"seed": 0, "epochs": 15, "progress": False, "solver": {"_target_": "S"}}
    for num, (arm, adjoint, bases) in enumerate(
        [("nmf_unroll", "implicit_ham.Unroll", False), ("nmf_one_step", "implicit_ham.OneStep",
          False), ("nmf_one_step_bases", "implicit_ham.OneStep", True)]
    ):  # fmt: skip
        config = {**common, "seed": num, "adjoint": {"_target_": adjoint},
                  "context": {"name": "nmf", "grad_through_bases": bases}}  # fmt: skip
        _results(tmp_path, num, arm, {"metrics": {"val/blob_acc": 0.5}, "config": config})
    rows = arms_table(group_jobs(collect_jobs(tmp_path))).markdown().splitlines()
    assert (
        "| arm=nmf_unroll | adjoint._target_=implicit_ham.Unroll, "
        "context.grad_through_bases=False, context.name=nmf, solver._target_=S |" in rows
    )
    assert (
        "| arm=nmf_one_step_bases | adjoint._target_=implicit_ham.OneStep, "
        "context.grad_through_bases=True, context.name=nmf, solver._target_=S |" in rows
    )
    assert not any("seed=" in r or "epochs=" in r or "progress" in r for r in rows[2:])


def test_a_baseline_arm_is_not_described_by_the_ham_options_it_ignores(tmp_path: Path) -> None:
    for num, (arm, context) in enumerate([("nmf", "nmf"), ("sdpa", "sdpa_attention")]):
        config = {"seed": 0, "adjoint": {"_target_": "implicit_ham.OneStep"},
                  "solver": {"_target_": "S"}, "context": {"name": context}}  # fmt: skip
        _results(tmp_path, num, arm, {"metrics": {"val/blob_acc": 0.5}, "config": config})
    rows = arms_table(group_jobs(collect_jobs(tmp_path))).markdown().splitlines()
    assert "| arm=nmf | adjoint._target_=implicit_ham.OneStep, context.name=nmf, " \
        "solver._target_=S |" in rows
    assert "| arm=sdpa | context.name=sdpa_attention (adjoint and solver unused: " \
        "sdpa_attention is not a ham) |" in rows


def test_every_jobs_failure_counts_by_kind_are_shown(tmp_path: Path) -> None:
    _results(tmp_path, 0, "nmf_implicit", {
        "metrics": {"val/blob_acc": 0.2},
        "failures": {"total": 480, "by_kind": {"backward_not_fixed_point": 480},
                     "by_action": {"continued": 480}},
        "events": {"total": 7, "by_kind": {"NotFixedPointWarning": 5, "ConvergenceWarning": 2}},
    })  # fmt: skip
    _results(tmp_path, 1, "nmf_unroll", {"metrics": {"val/blob_acc": 0.9}})
    text = write_report(tmp_path, tmp_path / "out").read_text()
    assert (
        "| 0 | arm=nmf_implicit | ok | backward_not_fixed_point: 480 | continued: 480 | "
        "ConvergenceWarning: 2, NotFixedPointWarning: 5 |" in text
    )
    assert "| 1 | arm=nmf_unroll | ok | none | none | none |" in text
    # each recorded name is explained by the library's own definition
    meanings = {
        "backward_not_fixed_point": FAILURE_MEANINGS["backward_not_fixed_point"],
        "continued": ACTION_MEANINGS["continued"],
        "ConvergenceWarning": " ".join((ih.ConvergenceWarning.__doc__ or "").split()),
        "NotFixedPointWarning": " ".join((ih.NotFixedPointWarning.__doc__ or "").split()),
    }
    for name, meaning in meanings.items():
        assert meaning and f"- `{name}`: {meaning}" in text


def test_a_name_the_library_does_not_define_is_flagged(tmp_path: Path) -> None:
    _results(tmp_path, 0, "old_run", {
        "metrics": {"val/blob_acc": 0.2},
        "failures": {"total": 1, "by_kind": {"retired_kind": 1}, "by_action": {"paused": 1}},
        "events": {"total": 1, "by_kind": {"RetiredWarning": 1}},
    })  # fmt: skip
    text = write_report(tmp_path, tmp_path / "out").read_text()
    assert "- `retired_kind`: not a failure kind of this library version" in text
    assert "- `paused`: not a policy action of this library version" in text
    assert "- `RetiredWarning`: not a warning of the library" in text
