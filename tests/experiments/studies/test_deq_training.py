"""The DEQ training study end to end on a tiny configuration (2 arms, 1 seed, 4 steps): the job
files and the committed rows (with where they ran), the resume (jobs with a row are skipped,
also without the job files; a changed configuration is refused), and the page (``python -m
experiments.report --deq CSV``) from the rows alone, whose numbers are recomputed here from the
job files and whose paired tests are checked against scipy's ``ttest_rel`` and Holm by its
definition."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import statistics
from pathlib import Path
from typing import Any

import pytest
import torch
from scipy import stats

import implicit_ham as ih
from experiments import report
from experiments.studies.csv_rows import write_row_list
from experiments.studies.deq_training import report as page_module
from experiments.studies.deq_training import rows as rows_module
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


def test_each_job_appends_its_row_with_where_it_ran(study: Path) -> None:
    rows = rows_module.read_rows(study / "runs.csv")
    assert [(r["arm"], r["seed"]) for r in rows] == [("none", 0), ("jacobian", 0)] or [
        (r["arm"], r["seed"]) for r in rows] == [("jacobian", 0), ("none", 0)]  # fmt: skip
    for row in rows:
        job = json.loads(job_path(study, row["arm"], 0).read_text())
        assert row["final_test_accuracy"] == job["final_test_accuracy"]  # bit for bit
        assert row["rho_max"] == max(p["spectral_radius"] for p in job["probes"])
        assert rows_module.curve(row, "accuracy_curve") == [
            (p["step"], pytest.approx(p["test_accuracy"], rel=1e-5)) for p in job["probes"]
        ]
        assert row["cpu"] and row["cpu"] != "unknown" and row["threads"] == TINY.threads == 1
        assert row["commit"] and row["torch"]  # "unknown" outside a git checkout
        assert json.loads(row["config"]) == json.loads(json.dumps(TINY.job_key()))


def test_a_second_run_skips_jobs_with_a_row_and_resumes_a_missing_one(
    study: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[str, int]] = []

    def fake(config: StudyConfig, arm: str, seed: int, out: Path) -> dict:
        calls.append((arm, seed))
        return json.loads(job_path(study, arm, seed).read_text())

    monkeypatch.setattr(study_module, "run_job", fake)
    assert run_study(TINY, study) == {"ran": [], "skipped": ["none_seed0", "jacobian_seed0"]}
    assert calls == []
    # a fresh machine: the committed CSV alone, no job files: nothing is re-run
    fresh, csv_path = tmp_path / "fresh", tmp_path / "runs.csv"
    shutil.copy(study / "runs.csv", csv_path)
    assert run_study(TINY, fresh, csv_path=csv_path)["ran"] == []
    # a job without a row runs, and its row is appended; the other row is kept as it was
    before = {r["arm"]: r for r in rows_module.read_rows(csv_path)}
    kept = [r for r in before.values() if r["arm"] != "jacobian"]
    write_row_list(csv_path, kept, rows_module.COLUMNS)
    assert run_study(TINY, fresh, csv_path=csv_path) == {
        "ran": ["jacobian_seed0"], "skipped": ["none_seed0"]}  # fmt: skip
    assert calls == [("jacobian", 0)]
    after = {r["arm"]: r for r in rows_module.read_rows(csv_path)}
    assert after == before
    # a job file without a row gets its row from the file, unrun
    copy = tmp_path / "copy"
    shutil.copytree(study, copy)
    (copy / "runs.csv").unlink()
    assert run_study(TINY, copy)["ran"] == [] and calls == [("jacobian", 0)]
    assert {r["arm"]: r for r in rows_module.read_rows(copy / "runs.csv")} == before


def test_a_job_file_or_row_of_another_configuration_is_refused(study: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="another configuration"):
        run_study(dataclasses.replace(TINY, lr=1.0), study)
    with pytest.raises(ValueError, match="row of none seed 0 has another configuration"):
        run_study(dataclasses.replace(TINY, lr=1.0), tmp_path, csv_path=study / "runs.csv")


def test_the_page_numbers_equal_a_recomputation_from_the_job_files(
    study: Path, tmp_path: Path
) -> None:
    out = tmp_path / "deq_training.md"
    page_module.write_deq_report(study / "runs.csv", out, TINY)
    text = out.read_text()
    for name in ("accuracy", "spectral_radius", "kappa", "forward_steps"):
        assert (tmp_path / "deq_training" / f"{name}.png").stat().st_size > 0
        assert f"](deq_training/{name}.png)" in text
    assert "(2 of 2 planned jobs," in text
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
    built = page_module.build_page(study / "runs.csv", tmp_path / "figures", TINY)
    none = json.loads(job_path(study, "none", 0).read_text())
    assert built.rows[0].arm == "none"
    assert built.rows[0].rho_max == max(p["spectral_radius"] for p in none["probes"])
    assert all(sentence in text for sentence in built.findings)
    assert "Highest" not in text and "Rows pending" not in text


def _holm(p: list[float]) -> list[float]:
    """Holm by its definition: the i-th smallest adjusted = max over j <= i of (m - j) p_(j)."""
    ranked = sorted(p)
    return [min(1.0, max((len(p) - j) * ranked[j] for j in range(ranked.index(v) + 1)))
            for v in p]  # fmt: skip


def test_the_page_from_a_fixture_csv_has_paired_tests_equal_to_scipys(
    study: Path, tmp_path: Path
) -> None:
    template = rows_module.read_rows(study / "runs.csv")[0]
    accuracy = {  # arm -> per seed; seed 3 of "spectral" is missing (no pair)
        "none": [0.980, 0.975, 0.985, 0.978],
        "jacobian": [0.960, 0.950, 0.970, 0.955],
        "spectral": [0.979, 0.980, 0.983],
        "combined": [0.981, 0.972, 0.990, 0.977],
    }
    fixture = [{**template, "arm": arm, "seed": seed, "final_test_accuracy": value}
               for arm, values in accuracy.items()
               for seed, value in enumerate(values)]  # fmt: skip
    csv_path = tmp_path / "runs.csv"
    write_row_list(csv_path, fixture, rows_module.COLUMNS)
    config = dataclasses.replace(TINY, arms=tuple(accuracy), seeds=(0, 1, 2, 3))
    page = page_module.build_page(csv_path, tmp_path / "figures", config)
    assert page.missing == ["spectral_seed3"] and page.jobs_found == 15
    base = accuracy["none"]
    expected = {arm: stats.ttest_rel(values, base[: len(values)])
                for arm, values in accuracy.items() if arm != "none"}  # fmt: skip
    holm = dict(zip(expected, _holm([float(r.pvalue) for r in expected.values()]), strict=True))
    tests = {t.arm: t for t in page.tests}
    assert set(tests) == set(expected)
    for arm, result in expected.items():
        t = tests[arm]
        diffs = [a - b for a, b in zip(accuracy[arm], base, strict=False)]
        assert t.n == len(diffs) and t.difference == pytest.approx(statistics.fmean(diffs))
        assert t.p == pytest.approx(float(result.pvalue), rel=1e-9)
        assert t.holm_p == pytest.approx(holm[arm], rel=1e-9)
        low, high = stats.t.interval(0.95, len(diffs) - 1, loc=statistics.fmean(diffs),
                                     scale=stats.sem(diffs))  # fmt: skip
        assert (t.lower, t.upper) == pytest.approx((low, high), rel=1e-9)
        assert t.resolved == (holm[arm] < 0.05)
    assert tests["jacobian"].resolved and not tests["combined"].resolved
    text = page_module.render(page)
    line = next(x for x in text.splitlines() if x.startswith("| `jacobian` | 4 |"))
    assert f"| {tests['jacobian'].p:.3f} | {holm['jacobian']:.3f} | resolved |" in line
    assert "1 of 3 stabilised arms differ from no stabilisation" in text
    assert "Highest" not in text


def test_an_empty_csv_gives_a_rows_pending_page(tmp_path: Path) -> None:
    out = tmp_path / "deq_training.md"
    report.main(["--deq", str(tmp_path / "absent.csv"), "--out", str(out)])
    text = out.read_text()
    assert "**Rows pending.**" in text and "(0 of 15 planned jobs)" in text
    assert "## What was found" not in text and "test acc." not in text
    assert not (tmp_path / "deq_training").exists()  # no figure drawn


@pytest.mark.parametrize(
    ("change", "message"),
    [({"arms": ("none", "dropout")}, "unknown arms"), ({"correction_states": (0, 5)}, r"\[0\]"),
     ({"seeds": ()}, "at least one seed")],
)  # fmt: skip
def test_a_bad_configuration_is_refused_early(change: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(TINY, **change)


def test_a_job_on_the_trainer_equals_a_hand_written_adam_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``run_job`` (the ``Trainer``, ``PermutationBatches``, ``JobLog``) gives the weights, step
    losses and probes of a plain loop: same seed, batches as consecutive slices of seeded
    permutations (batch 700 of 1438 images: the third step draws a new permutation), one Adam
    step each, the probes before the first step, at step 2 and after the last."""
    config = dataclasses.replace(TINY, arms=("combined",), steps=3, batch=700)
    built: list[torch.nn.Module] = []

    def build(config: StudyConfig, arm: study_module.Arm) -> tuple[torch.nn.Module, Any]:
        model, optimizer = real_build(config, arm)
        built.append(model)
        return model, optimizer

    real_build = study_module.build
    monkeypatch.setattr(study_module, "build", build)
    job = study_module.run_job(config, "combined", 0, tmp_path)
    monkeypatch.undo()

    arm = study_module.ARMS["combined"]
    torch.manual_seed(0)
    (x, y), (test_x, test_y) = study_module.load_split("train"), study_module.load_split("val")
    model, optimizer = study_module.build(config, arm)

    def measure(step: int) -> dict[str, Any]:
        return {"step": step, **study_module.probe(model, test_x[: config.probe_size], config),
                "test_accuracy": study_module.accuracy(model, test_x, test_y, config)}  # fmt: skip

    order = torch.Generator().manual_seed(0)
    perm, cursor, losses, probes = torch.randperm(len(x), generator=order), 0, [], [measure(0)]
    for step in (1, 2, 3):
        if cursor + config.batch > len(x):
            perm, cursor = torch.randperm(len(x), generator=order), 0
        index, cursor = perm[cursor : cursor + config.batch], cursor + config.batch
        loss, _ = study_module._loss(model, x[index], y[index], arm, config)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(float(loss))
        if step != 1:
            probes.append(measure(step))
    ported = built[0].state_dict()
    assert all(torch.equal(ported[k], v) for k, v in model.state_dict().items())
    assert [s["loss"] for s in job["steps"]] == losses
    assert job["probes"] == probes and job["failure"] is None


def test_a_non_finite_step_ends_the_job_with_its_step_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``ih.NonFiniteError`` in step 3 stops the job there: two step records, the probes up to
    step 2, the failure naming step 3, no final accuracy; the job file is written."""
    config = dataclasses.replace(TINY, arms=("none",), steps=4)
    real_step = study_module.train_step

    def failing(model: Any, optimizer: Any, batch: Any, arm: Any, config: Any) -> Any:
        if len(calls) == 2:
            raise ih.NonFiniteError("loss is nan")
        calls.append(1)
        return real_step(model, optimizer, batch, arm, config)

    calls: list[int] = []
    monkeypatch.setattr(study_module, "train_step", failing)
    job = study_module.run_job(config, "none", 0, tmp_path)
    assert job["failure"] == "step 3: loss is nan" and job["final_test_accuracy"] is None
    assert [s["step"] for s in job["steps"]] == [1, 2]
    assert [p["step"] for p in job["probes"]] == [0, 2]
    assert json.loads(job_path(tmp_path, "none", 0).read_text())["failure"] == job["failure"]


def test_a_sigterm_lets_the_job_in_flight_finish_and_starts_no_other(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = study_module.run_job

    def signalled(config: StudyConfig, arm: str, seed: int, out_dir: Path) -> dict:
        os.kill(os.getpid(), signal.SIGTERM)  # arrives while this job runs
        return real(config, arm, seed, out_dir)

    monkeypatch.setattr(study_module, "run_job", signalled)
    with pytest.raises(SystemExit) as stopped:
        run_study(TINY, tmp_path)
    assert stopped.value.code == 128 + signal.SIGTERM
    assert [r["arm"] for r in rows_module.read_rows(tmp_path / "runs.csv")] == ["none"]
    monkeypatch.setattr(study_module, "run_job", real)
    assert run_study(TINY, tmp_path) == {"ran": ["jacobian_seed0"], "skipped": ["none_seed0"]}
