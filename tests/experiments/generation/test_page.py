"""Results file -> page: every number from the rows, the gate, the verdicts, the plateau, a
rerun from the file alone writing the same page; the study skipping finished jobs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.generation.job import ARMS, GanJob
from experiments.generation.report import write_generation_report
from experiments.generation.study import (
    GateNotPassedError,
    append_row,
    finished,
    phase_jobs,
    read_rows,
    run_phase,
)

CONSISTENCY = {"none": 0.08, "self_attention": 0.40, "nmf_one_step": 0.35, "nmf_unroll": 0.30,
               "vq_one_step": 0.20}  # fmt: skip


def synthetic_row(job: GanJob) -> dict:
    seed, arm = job.seed, job.arm
    fid = 20.0 - 10 * CONSISTENCY[arm] + 0.5 * seed
    curve = [{"step": s, "fid": fid * (1 + 150 / s), "kid": 0.01, "kid_std": 0.0,
              "precision": 0.5, "recall": 0.4, "consistency": CONSISTENCY[arm],
              "kappa": CONSISTENCY[arm]}
             for s in range(job.eval_every, job.steps + 1, job.eval_every)]  # fmt: skip
    return {
        "job": job.name, "definition": job.definition(), "fid": fid, "kid": fid / 1000,
        "kid_std": 0.001, "precision": 0.6, "recall": 0.5,
        "consistency": CONSISTENCY[arm] + 0.01 * seed, "kappa": CONSISTENCY[arm] + 0.01 * seed,
        "reference": {"fid": 1.234, "kid": 0.0001, "kid_std": 0.0, "precision": 0.7,
                      "recall": 0.7, "consistency": 0.93, "kappa": 0.97},
        "classifier_accuracy": 0.99, "fid_change_last": 0.01 if arm != "nmf_unroll" else 0.09,
        "plateau": arm != "nmf_unroll", "time_per_step_s": 0.1, "peak_rss_mib": 400.0,
        "rss_before_mib": 300.0, "skipped_updates": 0, "params_g": 10, "params_d": 20,
        "params_context": 5, "curve": curve,
        "gates": [{"step": 0, "gamma_g": 0.0, "gamma_d": 0.0},
                  {"step": 25, "gamma_g": 0.1, "gamma_d": -0.1}],
    }  # fmt: skip


def test_results_file_round_trip(tmp_path: Path) -> None:
    results = tmp_path / "results.jsonl"
    for job in phase_jobs("main"):
        append_row(results, synthetic_row(job))
    out = tmp_path / "docs" / "generation.md"
    text = write_generation_report(tmp_path / "no_sweep", out, "make generate", results).read_text()
    assert "kappa(self_attention) - kappa(none) = +0.320" in text
    assert "passed" in text and "real data (reference)" in text and "1.234" in text
    assert "Not at a plateau in every seed: Hamburger NMF, BPTT." in text
    # NMF BPTT vs none on kappa: +0.22 in every seed -> better (a point interval)
    assert "kappa: nmf_unroll − none = +0.22 [+0.22, +0.22] over 5 seeds: **better**" in text
    assert "fid: self_attention − none = -3.2 [-3.2, -3.2] over 5 seeds: **better**" in text
    assert "Main sweep" not in text  # all 25 jobs present
    assert "1×1 noise cells = 8 pixels" in text  # the probe's fields
    assert (out.parent / "generation" / "curves.png").exists()
    assert (out.parent / "generation" / "gates.png").exists()
    again = write_generation_report(
        tmp_path / "no_sweep", out, "make generate", results
    ).read_text()
    assert again == text


def test_failed_gate_is_reported_and_stops_the_main_sweep(tmp_path: Path) -> None:
    results = tmp_path / "results.jsonl"
    for job in phase_jobs("pilot"):
        row = synthetic_row(job)
        row["kappa"] = 0.1 + (0.02 if job.arm == "self_attention" and job.seed == 0 else 0.0)
        append_row(results, row)
    text = write_generation_report(
        tmp_path, tmp_path / "generation.md", "make generate", results
    ).read_text()
    assert "failed" in text and "was not run" in text and "Main sweep: 6 of 25" in text
    with pytest.raises(GateNotPassedError, match="did not pass"):
        run_phase("main", tmp_path / "out", results)


def test_finished_jobs_are_skipped_without_training(tmp_path: Path) -> None:
    results = tmp_path / "results.jsonl"
    for job in phase_jobs("pilot"):
        append_row(results, synthetic_row(job))
    rows = run_phase("pilot", tmp_path / "out", results)  # nothing to run: no classifier, no pool
    assert [r["job"] for r in rows] == [j.name for j in phase_jobs("pilot")]
    assert not (tmp_path / "out" / "classifier.pt").exists()
    changed = GanJob("none", 0, steps=300, eval_every=150)
    assert finished(read_rows(results), changed) is None  # another definition is not "finished"
    assert (
        len(set(ARMS)) == 5
        and json.loads(results.read_text().splitlines()[0])["job"] == "none_seed0"
    )


def test_rows_of_other_definitions_are_left_out(tmp_path: Path) -> None:
    results = tmp_path / "results.jsonl"
    for job in phase_jobs("pilot"):
        append_row(results, synthetic_row(job))
    stale = synthetic_row(GanJob("vq_one_step", 0, steps=300, eval_every=150))
    append_row(results, stale)
    text = write_generation_report(
        tmp_path, tmp_path / "g.md", "make generate", results
    ).read_text()
    assert "Hamburger VQ" not in text and "Main sweep: 6 of 25" in text


def test_earlier_designs_are_listed_with_what_changed(tmp_path: Path) -> None:
    results = tmp_path / "results.jsonl"
    for job in phase_jobs("pilot"):
        append_row(results, synthetic_row(job))
    current = phase_jobs("pilot")[0]
    old = synthetic_row(GanJob("none", 0, steps=300, eval_every=150, lr_g=current.lr_g / 2))
    old["fid"] = 1241.0
    append_row(tmp_path / "history.jsonl", old)
    text = write_generation_report(
        tmp_path, tmp_path / "g.md", "make generate", results
    ).read_text()
    assert "Earlier designs" in text and "1241" in text
    assert (
        f"steps 300 → {current.steps}" in text
        and f"lr_g {current.lr_g / 2} → {current.lr_g}" in text
    )
