"""Each arm's gradient-trust evidence beside its metric (issue 45 item 6): read from the
records the engine writes (``results.json``'s failures, events, solver layers and world size;
the steps of ``metrics.jsonl``), checked here against counts computed by hand and against a
real training job's own failure log."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.train_jobs import run_train

from experiments.engine.file_sinks import read_jsonl
from experiments.reports.sweep import arm_keys, write_report
from experiments.reports.sweep_jobs import collect_jobs, group_jobs
from experiments.reports.sweep_trust import evidence, reading, trust_table


def _job(root: Path, num: int, arm: str, target: str, body: dict, steps: int = 10) -> None:
    job = root / str(num)
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "overrides.yaml").write_text(f"- +arm={arm}\n- seed={num}\n")
    config = {"adjoint": {"_target_": target}, "context": {"name": "nmf"}, "seed": num}
    record = {"status": "ok", "config": config, "solver": {"context.ham": {}, "head.ham": {}},
              "world_size": 1, **body}  # fmt: skip
    (job / "results.json").write_text(json.dumps(record))
    rows = [{"step": steps // 2, "epoch": 1, "val/blob_acc": 0.1},
            {"step": steps, "epoch": 2, "val/blob_acc": 0.1}]  # fmt: skip
    (job / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _failures(n: int, fallback: int = 0) -> dict:
    actions = {"continued": n - fallback, "fallback": fallback}
    return {"by_kind": {"backward_not_fixed_point": n}, "by_action": actions, "total": n}


def _events(backward: int, forward: int = 0) -> dict:
    return {"by_source": {"implicit backward": {"ConvergenceWarning": backward},
                          "context.ham": {"ConvergenceWarning": forward}}}  # fmt: skip


@pytest.fixture()
def sweep(tmp_path: Path) -> Path:
    """Four arms x two seeds, 10 steps x 2 implicit layers = 20 backward passes per job."""
    for seed in (0, 1):
        _job(tmp_path, 0 + seed, "implicit", "implicit_ham.Implicit",
             {"failures": _failures(5 + seed, fallback=seed), "events": _events(7, forward=99),
              "metrics": {"val/blob_acc": 0.5}})  # fmt: skip
        _job(tmp_path, 2 + seed, "implicit_ok", "implicit_ham.Implicit",
             {"failures": _failures(0), "events": _events(0, forward=3),
              "metrics": {"val/blob_acc": 0.6}})  # fmt: skip
        _job(tmp_path, 4 + seed, "unroll", "implicit_ham.Unroll",
             {"failures": _failures(0), "events": _events(0), "metrics": {"val/blob_acc": 0.7}})
        _job(tmp_path, 6 + seed, "one_step", "implicit_ham.OneStep",
             {"failures": _failures(0), "events": _events(0), "metrics": {"val/blob_acc": 0.8},
              "fidelity": [{"adjoint": "unroll", "reference": True, "cosine": 1.0},
                           {"adjoint": "one_step", "reference": False, "cosine": 0.25}]})
    return tmp_path


def test_the_evidence_is_the_recorded_counts_over_the_backward_passes(sweep: Path) -> None:
    rows = {row.overrides["arm"]: row for row in group_jobs(collect_jobs(sweep))}
    implicit = evidence(rows["implicit"])
    # 2 jobs x 10 steps x 2 layers; 5 + 6 not-fixed-point passes; 7 + 7 backward warnings
    # (the forward's 99 are not backward solves); 0 + 1 fallbacks
    assert (implicit.mode, implicit.kind, implicit.passes) == ("Implicit", "at_fixed_point", 40)
    assert (implicit.not_fixed_point, implicit.unconverged, implicit.fallback) == (11, 14, 1)
    assert "11 of 40 (28%) backward passes were at a point that is not a fixed point" in (
        reading(implicit)
    )
    assert "1 fell back to the one-step gradient" in reading(implicit)
    assert reading(evidence(rows["implicit_ok"])).startswith("trust it: every backward pass")
    assert evidence(rows["unroll"]).kind == "unroll"
    one_step = evidence(rows["one_step"])
    assert one_step.kind == "approximate" and one_step.cosines == (("one_step", 0.25),) * 2


def test_the_report_puts_the_evidence_beside_each_arms_metric(sweep: Path) -> None:
    rows = group_jobs(collect_jobs(sweep))
    lines = trust_table(rows, arm_keys(rows), "val/blob_acc").markdown().splitlines()
    assert lines[0].startswith("| arm | val/blob_acc | backward mode | passes at a non-fixed")
    assert lines[2].startswith("| arm=implicit | 0.500 ± 0.000 | Implicit | 11 of 40 (28%) | "
                               "14 of 40 (35%) | not measured | do not trust it")  # fmt: skip
    assert lines[3].startswith("| arm=implicit_ok | 0.600 ± 0.000 | Implicit | 0 of 40 (0%) | "
                               "0 of 40 (0%) | not measured | trust it")  # fmt: skip
    assert lines[4].startswith("| arm=unroll | 0.700 ± 0.000 | Unroll | n/a | n/a | not measured | "
                               "trust it as the exact gradient")  # fmt: skip
    assert lines[5].startswith("| arm=one_step | 0.800 ± 0.000 | OneStep | n/a | n/a | "
                               "one_step 0.250 (2 jobs) | an approximate gradient")
    assert "## Which gradient to trust" in write_report(sweep, sweep / "out").read_text()


@pytest.mark.slow
def test_the_evidence_of_a_real_job_agrees_with_its_failure_log(tmp_path: Path) -> None:
    args = ["epochs=2", "data.train_size=16", "data.val_size=8", "data.image_size=32",
            "data.num_classes=3", "context.rank=4", "context.steps=2", "context.eval_steps=2",
            "batch_size=8", "progress=false", "threads=1", "adjoint=implicit"]  # fmt: skip
    proc = run_train(tmp_path / "0", args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (row,) = group_jobs(collect_jobs(tmp_path))
    found = evidence(row)
    log = read_jsonl(tmp_path / "0" / "tables" / "failures.jsonl")
    steps = 2 * 16 // 8  # epochs x batches per epoch, one implicit layer
    assert found.passes == steps
    assert found.not_fixed_point == sum(r["kind"] == "backward_not_fixed_point" for r in log)
    assert found.not_fixed_point == steps  # a 2-step NMF is never at its fixed point
