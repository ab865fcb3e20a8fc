"""The DEQ training study end to end on a tiny configuration (2 arms, 1 seed, 4 steps): the job
files, the resume (finished jobs are skipped, a changed configuration is refused), and the page
(``python -m experiments.report --deq``), whose numbers are recomputed here from the job files."""

from __future__ import annotations

import csv
import dataclasses
import json
import shutil
import statistics
from pathlib import Path

import pytest
from scipy import stats

from experiments import report
from experiments.studies.deq_training import report as page_module
from experiments.studies.deq_training import run as study_module
from experiments.studies.deq_training.run import StudyConfig, job_path, run_study

TINY = StudyConfig(
    arms=("none", "jacobian"), seeds=(0,), steps=4, batch=16, width=4, groups=2,
    forward_steps=8, backward_steps=10, correction_states=(2, 4), probe_every=2,
    probe_size=8, probe_steps=30,
)  # fmt: skip


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("deq_study")
    done = run_study(TINY, out)
    assert done == {"ran": ["none_seed0", "jacobian_seed0"], "skipped": []}
    return out


def test_each_job_writes_its_steps_probes_and_config(study: Path) -> None:
    for arm in TINY.arms:
        job = json.loads(job_path(study, arm, 0).read_text())
        assert job["arm"] == arm and job["seed"] == 0 and job["failure"] is None
        assert job["config"] == json.loads(json.dumps(TINY.job_key()))
        assert [s["step"] for s in job["steps"]] == [1, 2, 3, 4]
        assert [p["step"] for p in job["probes"]] == [0, 2, 4]  # before, every 2, after
        for probe in job["probes"]:
            assert probe["spectral_radius"] > 0 and probe["kappa"] >= 1.0
            assert 0.0 <= probe["test_accuracy"] <= 1.0
        assert job["final_test_accuracy"] == job["probes"][-1]["test_accuracy"]
        for step in job["steps"]:
            assert 1 <= step["forward_steps"] <= TINY.forward_steps
            # the library's warnings and its stats tell the same story, step by step
            warned = step["warnings"].get("NotFixedPointWarning", 0)
            assert warned == (0 if step["backward_at_fixed_point"] else 1)
            assert step["time_s"] > 0
    assert json.loads((study / "config.json").read_text())["arms"] == list(TINY.arms)


def test_a_second_run_skips_finished_jobs_and_resumes_a_missing_one(
    study: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[str, int]] = []
    monkeypatch.setattr(study_module, "run_job", lambda c, arm, seed, o: calls.append((arm, seed)))
    assert run_study(TINY, study) == {"ran": [], "skipped": ["none_seed0", "jacobian_seed0"]}
    assert calls == []
    copy = tmp_path / "copy"
    shutil.copytree(study, copy)
    job_path(copy, "jacobian", 0).unlink()
    assert run_study(TINY, copy) == {"ran": ["jacobian_seed0"], "skipped": ["none_seed0"]}
    assert calls == [("jacobian", 0)]


def test_a_job_file_of_another_configuration_is_refused(study: Path) -> None:
    with pytest.raises(ValueError, match="another configuration"):
        run_study(dataclasses.replace(TINY, lr=1.0), study)


def test_the_page_numbers_equal_a_recomputation_from_the_job_files(
    study: Path, tmp_path: Path
) -> None:
    out = tmp_path / "deq_training.md"
    report.main(["--deq", str(study), "--out", str(out)])
    text = out.read_text()
    for name in ("accuracy", "spectral_radius", "kappa", "forward_steps"):
        assert (tmp_path / "deq_training" / f"{name}.png").stat().st_size > 0
        assert f"](deq_training/{name}.png)" in text
    assert "from 2 of 2 planned jobs" in text
    assert f"| {TINY.lr} / {TINY.conv_lr} |" in text
    rows = {line.split("|")[1].strip(): line for line in text.splitlines()
            if line.startswith("| `") and "±" in line}  # fmt: skip
    for arm in TINY.arms:  # one seed: each mean is the job's own value
        job = json.loads(job_path(study, arm, 0).read_text())
        steps, probes = job["steps"], job["probes"]
        rho = [p["spectral_radius"] for p in probes]
        expected = [
            f"{probes[-1]['test_accuracy']:.3f} ± n/a",
            f"| {rho[0]:.3f} | {max(rho):.3f} | {rho[-1]:.3f} | {int(max(rho) > 1)} / 1 |",
            f"| {max(p['kappa'] for p in probes):.1f} | {probes[-1]['kappa']:.1f} |",
            f"| {sum(s['forward_steps'] for s in steps) / len(steps):.1f} |",
            f"| {100 * sum(not s['forward_converged'] for s in steps) / len(steps):.0f}% |",
            f"| {100 * sum(not s['backward_at_fixed_point'] for s in steps) / len(steps):.0f}% |",
            f"| {1e3 * statistics.median(s['time_s'] for s in steps):.0f} |",
        ]
        for cell in expected:
            assert cell in rows[f"`{arm}`"], (arm, cell, rows[f"`{arm}`"])
    built = page_module.build_page(study, tmp_path / "figures")
    none = json.loads(job_path(study, "none", 0).read_text())
    assert built.rows[0].arm == "none"
    assert built.rows[0].rho_max == max(p["spectral_radius"] for p in none["probes"])
    assert all(sentence in text for sentence in built.findings)
    # the per-job rows beside the figures: one per job, its accuracy the job's own
    with (tmp_path / "deq_training" / "jobs.csv").open() as fh:
        committed = {(r["arm"], int(r["seed"])): r for r in csv.DictReader(fh)}
    assert set(committed) == {(arm, 0) for arm in TINY.arms}
    for arm in TINY.arms:
        job = json.loads(job_path(study, arm, 0).read_text())
        assert float(committed[(arm, 0)]["final_test_accuracy"]) == job["final_test_accuracy"]


def test_accuracy_comparisons_are_paired_t_tests_by_seed() -> None:
    def arm(name: str, by_seed: dict[int, float]) -> page_module.ArmRow:
        values = list(by_seed.values())
        return page_module.ArmRow(
            arm=name, title=name, seeds=len(values), failed=0,
            accuracy=statistics.fmean(values), accuracy_std=statistics.stdev(values),
            rho_start=0.3, rho_final=0.5, rho_max=0.6, seeds_above_one=0, first_above_one=None,
            kappa_final=2.0, kappa_max=3.0, forward_steps=10.0, forward_missed=0.0,
            backward_not_fixed_point=0.0, backward_missed=0.0, warnings={}, step_ms=10.0,
            by_seed=tuple(by_seed.items()),
        )  # fmt: skip

    a = arm("a", {0: 0.97, 1: 0.975, 2: 0.96, 3: 0.99})
    b = arm("b", {1: 0.98, 2: 0.985, 0: 0.981, 5: 0.5})  # seed 5 has no partner
    result = page_module.paired(a, b)
    expected = stats.ttest_rel([0.97, 0.975, 0.96], [0.981, 0.98, 0.985])
    assert result.n == 3 and result.p == pytest.approx(float(expected.pvalue), rel=1e-12)
    assert result.difference == pytest.approx((0.97 + 0.975 + 0.96 - 0.981 - 0.98 - 0.985) / 3)
    assert f"n = 3, p = {result.p:.2g}" in result.text()
    assert page_module.paired(a, arm("c", {7: 0.9, 8: 0.8})).p is None
    sentences = page_module.findings([arm("none", {0: 0.98, 1: 0.97, 2: 0.99}), a])
    assert "paired by seed" in sentences[1] and "two standard errors" not in " ".join(sentences)
    assert "Highest mean test accuracy" in sentences[-1]


def test_the_page_refuses_an_empty_study(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no finished job"):
        page_module.build_page(tmp_path, tmp_path / "figures")


@pytest.mark.parametrize(
    ("change", "message"),
    [({"arms": ("none", "dropout")}, "unknown arms"), ({"correction_states": (0, 5)}, r"\[0\]"),
     ({"seeds": ()}, "at least one seed")],
)  # fmt: skip
def test_a_bad_configuration_is_refused_early(change: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(TINY, **change)


def test_a_damaged_job_file_is_named_and_the_rest_still_reported(
    study: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    damaged = tmp_path / "study"
    shutil.copytree(study, damaged)
    bad = job_path(damaged, "jacobian", 0)
    bad.write_text('{"arm": "jacobian", "se')  # cut off mid-write
    out = tmp_path / "deq_training.md"
    with caplog.at_level("WARNING"):
        report.main(["--deq", str(damaged), "--out", str(out)])
    assert str(bad) in caplog.text and "reported as missing" in caplog.text
    text = out.read_text()
    assert "from 1 of 2 planned jobs" in text and "`none`" in text
