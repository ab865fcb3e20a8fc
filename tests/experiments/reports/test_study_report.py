"""docs/results.md's generator on a synthetic study folder: known runs in, known numbers and
verdicts out; missing parts are named, not silently skipped."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from experiments.reports.sweep_jobs import find_job
from experiments.studies.legend_seg.report import write_study_report

CONFIG = {
    "data": {
        "_target_": "experiments.data.splits.legend_seg",
        "image_size": 64,
        "num_classes": 4,
        "train_size": 512,
        "val_size": 128,
        "seed": 0,
    },
    "model": {"arch": "two_stream", "width": 32},
    "batch_size": 16,
    "epochs": 12,
    "threads": 1,
    "optim": {"_target_": "torch.optim.AdamW", "lr": 0.003},
}  # fmt: skip
STEPS = 384  # 512 / 16 * 12
MIOU = {  # (context, adjoint) -> per-seed mIoU; blob accuracy is mIoU + 0.05
    ("nmf", "unroll"): [0.90, 0.92, 0.91],
    ("nmf", "one_step"): [0.30, 0.28, 0.29],
    ("vq", "unroll"): [0.50, 0.52, 0.48],
    ("vq", "one_step"): [0.60, 0.61, 0.62],
    ("cd", "unroll"): [0.70, 0.71, 0.72],
    ("cd", "one_step"): [0.70, 0.695, 0.71],  # 0.008 below BPTT, std 0.01: counts as holding
    ("nmf", "implicit"): [0.25, 0.26, 0.27],
}


def _job(
    folder: Path, num: int, overrides: list[str], results: dict, config: dict = CONFIG
) -> None:
    job = folder / str(num)
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    (job / "results.json").write_text(json.dumps({"status": "ok", "config": config, **results}))


@pytest.fixture()
def study(tmp_path: Path) -> Path:
    root = tmp_path / "study"
    num = 0
    for (context, adjoint), values in MIOU.items():
        for seed, miou in enumerate(values):
            missed = STEPS // 2 if adjoint == "implicit" else 0
            failures = {"by_kind": {"backward_not_converged": missed}}
            _job(root / "adjoints", num,
                 [f"context={context}", f"adjoint={adjoint}", "context.steps=6", f"seed={seed}"],
                 {"metrics": {"val/miou": miou, "val/blob_acc": miou + 0.05},
                  "train_time_s": 60.0, "failures": failures})  # fmt: skip
            num += 1
    (root / "adjoints" / "multirun.yaml").write_text("{}")
    return root


def _cell(values: list[float]) -> str:
    return f"{statistics.fmean(values):.3f} ± {statistics.stdev(values):.3f}"


def test_tables_hold_the_mean_and_std_over_seeds(study: Path, tmp_path: Path) -> None:
    text = write_study_report(study, tmp_path / "docs", "echo run").read_text()
    assert "```bash\necho run\n```" in text
    nmf_unroll = [v + 0.05 for v in MIOU[("nmf", "unroll")]]
    assert "| ham | backward | K=6 |" in text  # only the K values the sweep ran get a column
    assert f"| nmf | unroll | {_cell(nmf_unroll)} |" in text
    assert f"| vq | one_step | {_cell(MIOU[('vq', 'one_step')])} |" in text
    assert "| nmf | 50.0 % |" in text  # 192 of 384 backward solves missed
    assert "12 epochs = 384 steps" in text
    assert "21/21 jobs ok, 21.0 min of training time" in text
    assert (tmp_path / "docs" / "results" / "q1_metrics_vs_k.png").stat().st_size > 0


def test_verdict_follows_the_numbers(study: Path, tmp_path: Path) -> None:
    text = write_study_report(study, tmp_path / "docs", "").read_text()
    assert "One-step ≥ BPTT (within the larger seed std) holds for VQ, CD and not for NMF." in text
    assert (
        "Stress test (legend_seg, context learned from unlabelled pixels), Q1: the paper's "
        "one-step ≥ BPTT holds for VQ, CD and not for NMF there" in text
    )
    diff = statistics.fmean(MIOU[("nmf", "one_step")]) - statistics.fmean(MIOU[("nmf", "unroll")])
    assert f"| nmf | 78.3 vs 77.4 | {_cell(MIOU[('nmf', 'one_step')])} | " in text
    assert f"{diff:+.3f} |" in text


def test_missing_parts_are_named(study: Path, tmp_path: Path) -> None:
    text = write_study_report(study, tmp_path / "docs", "").read_text()
    missing = text.split("**Missing** (not run or failed): ")[1].split("\n")[0]
    assert missing.startswith(
        "sweep `context`, sweep `remedy`, sweep `legend_probe`, sweep `ridge`, `grad/init_nmf`, "
    )
    assert "paper" not in missing  # the paper regime is study v4's CSV, reported by its own page
    assert "`grad/trained_cd`" in missing and "`convergence/trained_vq`" in missing
    assert missing.endswith("`bench.json`.")
    assert "Not run: the `context` sweep is missing." in text


def test_grad_study_norm_ratio_and_conditioning_rows(study: Path, tmp_path: Path) -> None:
    grad = study / "grad" / "init_nmf"
    grad.mkdir(parents=True)
    rows = [{"adjoint": "unroll", "K": k, "grad_norm": n, "cosine": 0.5, "cosine_same_k": 1.0}
            for k, n in ((1, 2.0), (6, 30.0))]  # fmt: skip
    conditioning = [{"point": "converged", "steps": 500, "fixed_point_residual": 1e-6,
                     "spectral_radius": 1.0, "sigma_min": 1e-8, "kappa": 3e8}]  # fmt: skip
    (grad / "results.json").write_text(
        json.dumps({"grad_vs_k": rows, "conditioning": conditioning, "elapsed_s": 30.0})
    )
    text = write_study_report(study, tmp_path / "docs", "").read_text()
    assert "| nmf | init | 2 | 30 | 15 |" in text  # norms at K = 1, 6 and their ratio
    assert "`grad/init_nmf`" not in text
    assert "| nmf | init | converged | 500 | 1e-06 | 1 | 1e-08 | 3e+08 |" in text
    assert "No-training studies: 1 runs, 0.5 min." in text


def test_a_missing_study_folder_says_what_to_run(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="make study-stress"):
        write_study_report(tmp_path / "nope", tmp_path / "docs", "")


def test_find_job_needs_exactly_one_match(study: Path) -> None:
    job = find_job(study / "adjoints", context="vq", adjoint="one_step", seed="2")
    assert job.metrics["val/miou"] == MIOU[("vq", "one_step")][2]
    with pytest.raises(LookupError, match=r"3 jobs .* match"):
        find_job(study / "adjoints", context="vq", adjoint="one_step")
    with pytest.raises(LookupError, match="0 jobs"):
        find_job(study / "adjoints", context="svd")


def test_baselines_remedies_and_converged_solves(study: Path, tmp_path: Path) -> None:
    """Question 3's parameter arithmetic, question 2's remedy ranking (the unremedied
    baseline is never 'best') and question 4's verdict with a null metric."""
    for num, (arm, params, miou) in enumerate(
        [("none", 28000, 0.20), ("sdpa_matched", 53000, 0.90), ("none", 28000, 0.22)]
    ):
        _job(study / "context", num, [f"+arm={arm}", f"seed={num}"],
             {"metrics": {"val/miou": miou, "val/blob_acc": miou}, "parameters": params,
              "train_time_s": 10.0})  # fmt: skip
    remedy = {("nmf", "0.0"): 0.9, ("nmf", "0.1"): 0.3, ("nmf_normalized", "1.0"): 0.5}
    for num, ((context, ridge), acc) in enumerate(remedy.items()):
        _job(study / "remedy", num, [f"context={context}", f"adjoint.ridge={ridge}", "seed=0"],
             {"metrics": {"val/miou": acc, "val/blob_acc": acc}})  # fmt: skip
    conv = study / "convergence" / "trained_nmf"
    conv.mkdir(parents=True)
    rows = [{"solver": "fixed_point K=6", "final_rel_residual": 0.2, "val/blob_acc": 0.9},
            {"solver": "fixed_point K=50", "final_rel_residual": 0.01, "val/blob_acc": 0.6},
            {"solver": "anderson K<=50 tol=1e-4", "final_rel_residual": 1.0,
             "val/blob_acc": None}]  # fmt: skip
    (conv / "results.json").write_text(json.dumps({
        "config": {"context": {"eval_steps": 6}}, "eval_solvers": rows, "traces": {},
        "convergence": [{"solver": "fixed_point", "steps": 60, "final_rel_residual": 0.01,
                         "steps_to_1e-06": -1, "contraction": 0.95}]}))  # fmt: skip
    text = write_study_report(study, tmp_path / "docs", "").read_text()
    assert "| none | 2.8e+04 | 0 |" in text and "| sdpa_matched | 5.3e+04 | 2.5e+04 |" in text
    assert "Best remedy arm by blob accuracy: `nmf_normalized` with λ = 1.0" in text
    assert "nmf: K=6 → fixed_point K=50 hurts (0.900 → 0.600)" in text
    assert "| nmf | trained | fixed_point | 60 | 0.01 | never | 0.95 |" in text


def test_the_last_invocations_wall_clock_comes_from_study_shs_stamps(
    study: Path, tmp_path: Path
) -> None:
    text = write_study_report(study, tmp_path / "docs", "").read_text()
    assert "The last `make study-stress` ran" not in text  # no stamps: no claim
    (study / ".started").write_text("1000\n")
    (study / ".finished").write_text("500\n")  # out of order: an unfinished run, no claim
    text = write_study_report(study, tmp_path / "docs", "").read_text()
    assert "The last `make study-stress` ran" not in text
    (study / ".finished").write_text("4123\n")
    text = write_study_report(study, tmp_path / "docs", "").read_text()
    assert "- The last `make study-stress` ran 52.0 min end to end" in text


# Settings unlike the presets' (conf/adjoint, conf/experiment): the document must quote these.
SETTINGS: dict[str, dict[str, dict]] = {
    "phantom": {"adjoint": {"_target_": "implicit_ham.Phantom", "k": 7, "tau": 0.25}},
    "implicit": {
        "adjoint": {"_target_": "implicit_ham.Implicit", "max_steps": 12, "tol": 1e-4,
                    "linear_solver": {"_target_": "implicit_ham.linalg.krylov.CG"}},
        "reliability": {"on_failure": "skip_batch"},
    },
}  # fmt: skip


def test_settings_are_read_from_the_jobs_configs(study: Path, tmp_path: Path) -> None:
    """Phantom's k and τ, the implicit arm's linear solver, iterations, tolerance and failure
    policy come from the arms' saved configs; without them the document writes ``?``."""
    bare = write_study_report(study, tmp_path / "bare", "").read_text()
    assert "`phantom` is Phantom(k=?, τ=?)" in bare and "`implicit` is ? (? iterations" in bare
    num = 100
    for adjoint, extra in SETTINGS.items():
        for seed in range(3):
            overrides = ["context=vq", f"adjoint={adjoint}", "context.steps=6", f"seed={seed}"]
            metrics = {"metrics": {"val/miou": 0.5, "val/blob_acc": 0.5}}
            _job(study / "adjoints", num, overrides, metrics, {**CONFIG, **extra})
            num += 1
    text = write_study_report(study, tmp_path / "docs", "").read_text()
    assert "`phantom` is Phantom(k=7, τ=0.25):" in text
    assert "`implicit` is CG (12 iterations, tol 0.0001) at the K-step state" in text
    assert "the unconverged CG result, `on_failure=skip_batch`" in text


def test_findings_hold_the_summary_and_the_closing_note(study: Path, tmp_path: Path) -> None:
    """findings.md (included by docs/index.md) is the document's own summary and closing note,
    generated with it, then study v3's verdicts (static: the close of section 1)."""
    text = write_study_report(study, tmp_path / "docs", "").read_text()
    findings = (tmp_path / "docs" / "results" / "findings.md").read_text()
    summary = text.split("## Summary (generated from the verdicts below)\n\n")[1].split("\n\n")[0]
    closing = text.split("## Closing note\n\n")[1].split("\n\n")[0]
    assert findings.startswith("<!-- generated by `python -m experiments.report --study`")
    assert f"\n\n{summary}\n\n{closing}\n" in findings
    v3 = text.split("### Closing note (paper regime)\n\n")[1].split("\n## ")[0]
    assert findings.split(closing)[1].strip() == v3.strip()
    assert v3.startswith("Paper regime (study v3: 5 independent replicates")
    assert "Q1: the paper's one-step ≥ BPTT holds for VQ, CD and not for NMF there" in findings


def test_the_closing_note_quotes_the_stress_verdict_and_the_page_holds_the_v3_history(
    study: Path, tmp_path: Path
) -> None:
    """The closing note's legend_seg clause is section 2's verdict; section 1 is study v3's
    static history, before section 2."""
    text = write_study_report(study, tmp_path / "docs", "").read_text()
    closing = text.split("## Closing note\n\n")[1].split("\n")[0]
    stress = "On the legend_seg stress test the paper's claim that its one-step gradient is at "
    assert stress in closing and "holds for VQ, CD and not for NMF (section 2)." in closing
    section = text.split("## 1. The paper's regime")[1].split("\n## 2. ")[0]
    assert "Study v3 (superseded by study v4 above" in section
    assert "### Verdicts: is the one-step at least as good as BPTT?" in section
    assert section.count("\n- ") == 14  # one bullet per verdict of the closing note


def test_a_job_without_a_config_in_results_json_is_read_from_hydras(
    study: Path, tmp_path: Path
) -> None:
    """The settings fall back to the job's ``.hydra/config.yaml`` (interpolations resolved)."""
    for seed in range(3):
        _job(study / "adjoints", 200 + seed,
             ["context=vq", "adjoint=phantom", "context.steps=6", f"seed={seed}"],
             {"metrics": {"val/miou": 0.5, "val/blob_acc": 0.5}}, {})  # fmt: skip
        hydra = study / "adjoints" / str(200 + seed) / ".hydra" / "config.yaml"
        hydra.write_text("adjoint:\n  k: 9\n  tau: ${half}\nhalf: 0.5\n")
    text = write_study_report(study, tmp_path / "docs", "").read_text()
    assert "`phantom` is Phantom(k=9, τ=0.5):" in text


def test_a_damaged_results_file_is_named_and_the_rest_reported(
    study: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    grad = study / "grad" / "init_nmf"
    grad.mkdir(parents=True)
    (grad / "results.json").write_text('{"status": "ok", "gra')  # a garbled study result
    (study / "bench.json").write_text("[1, 2")
    (study / "adjoints" / "0" / "results.json").write_text("\xff\xfe")  # one sweep job
    text = write_study_report(study, tmp_path / "docs", "").read_text()
    missing = text.split("**Missing** (not run or failed): ")[1].split("\n")[0]
    assert f"`grad/init_nmf` (damaged: {grad / 'results.json'})" in missing
    assert f"`bench.json` (damaged: {study / 'bench.json'})" in missing
    assert "1/21 jobs of `adjoints`" in missing  # the damaged job, the others reported
    assert str(grad / "results.json") in caplog.text and str(study / "bench.json") in caplog.text
