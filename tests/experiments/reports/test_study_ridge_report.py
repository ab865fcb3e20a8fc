"""The "Argmin hams" section of docs/results.md on a synthetic study folder: known runs in, known
cells and verdicts out; settings come from the jobs' configs; missing sweeps and rows are named."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from experiments.studies.legend_seg.report import write_study_report
from experiments.studies.legend_seg.ridge import ridge_section

STEPS = 384
CONFIG = {"data": {"train_size": 512}, "batch_size": 16, "epochs": 12}
TITLE = "## Argmin hams: does the ridge let the implicit gradient train?"
BLOB = {  # (sweep, context, adjoint) -> per-seed blob accuracy
    ("ridge", "nmf_ridge", "implicit"): [0.80, 0.82, 0.81],
    ("ridge", "nmf_ridge", "unroll"): [0.90, 0.92, 0.91],  # implicit 0.10 below: does not train
    ("ridge", "cd_ridge", "implicit"): [0.88, 0.90, 0.89],
    ("ridge", "cd_ridge", "unroll"): [0.89, 0.90, 0.91],  # 0.01 below, std 0.01: trains
    ("adjoints", "nmf", "implicit"): [0.24, 0.25, 0.26],
    ("adjoints", "nmf", "unroll"): [0.93, 0.94, 0.95],
}


def _study(root: Path, hams: dict[str, dict] | None = None) -> Path:
    """The jobs of ``BLOB``; ``hams``: the ridge jobs' ``context`` config by ham (none: the
    config records no context settings)."""
    nums: dict[str, int] = {}
    for (sweep, ham, adjoint), values in BLOB.items():
        for seed, blob in enumerate(values):
            overrides = [f"context={ham}", f"adjoint={adjoint}", f"seed={seed}"]
            if sweep == "adjoints":
                overrides.append("context.steps=6")
            missed = STEPS // 4 if adjoint == "implicit" else 0
            job = root / sweep / str(nums.setdefault(sweep, 0))
            nums[sweep] += 1
            (job / ".hydra").mkdir(parents=True)
            (job / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
            config = dict(CONFIG)
            if hams and sweep == "ridge":
                config["context"] = hams[ham]
            results = {
                "status": "ok",
                "config": config,
                "metrics": {"val/blob_acc": blob, "val/miou": blob - 0.1},
                "failures": {"by_kind": {"backward_not_fixed_point": missed}},
            }
            (job / "results.json").write_text(json.dumps(results))
    return root


def _cell(values: list[float]) -> str:
    return f"{statistics.fmean(values):.3f} ± {statistics.stdev(values):.3f}"


def test_the_table_holds_both_sweeps_and_the_failure_shares(tmp_path: Path) -> None:
    text = ridge_section(_study(tmp_path / "study"))
    ridge = BLOB[("ridge", "cd_ridge", "implicit")]
    miou = [v - 0.1 for v in ridge]
    assert f"| cd_ridge | implicit | {_cell(ridge)} | {_cell(miou)} | 0.0 % | 25.0 % |" in text
    nmf = BLOB[("adjoints", "nmf", "unroll")]
    assert f"| nmf | unroll | {_cell(nmf)} |" in text
    assert "cd implicit, cd one_step, cd unroll" in text  # missing from the adjoints sweep


def test_the_verdict_follows_the_numbers(tmp_path: Path) -> None:
    text = ridge_section(_study(tmp_path / "study"))
    assert "- nmf_ridge: the implicit gradient does not train as well as BPTT" in text
    assert "- cd_ridge: the implicit gradient trains as well as BPTT" in text
    assert "difference -0.100" in text and "(+0.560 for the argmin ham)" in text
    assert "plain CD's implicit arm (K = 6) is missing" in text


def test_the_settings_come_from_the_jobs_configs(tmp_path: Path) -> None:
    """K, the evaluation K, λ per ham and the seed count are read from the runs: values unlike
    the presets' show up as they are, and a config without them gives ``?``."""
    hams = {"nmf_ridge": {"steps": 4, "eval_steps": 9, "lam": 0.25},
            "cd_ridge": {"steps": 4, "eval_steps": 9, "lam": 2.0}}  # fmt: skip
    text = ridge_section(_study(tmp_path / "set", hams))
    assert "(K = 4 in training, 9 in evaluation, 3 seeds)" in text
    assert "λ(‖D‖² + ‖C‖²), λ = 0.25)" in text and "unit-norm concepts, λ = 2)" in text
    bare = ridge_section(_study(tmp_path / "bare"))
    assert "(K = ? in training and evaluation, 3 seeds)" in bare and "λ = ?)" in bare


def test_a_missing_ridge_sweep_is_named(tmp_path: Path) -> None:
    text = ridge_section(tmp_path / "no_study")
    assert text.startswith(TITLE + "\n\n")
    assert "Not run: the `ridge` sweep (`+experiment=study_ridge`) is missing." in text


def test_the_study_document_ends_with_the_section(tmp_path: Path) -> None:
    root = _study(tmp_path / "study")
    text = write_study_report(root, tmp_path / "docs", "").read_text()
    assert text.endswith(ridge_section(root))
    assert text.index("## Closing note") < text.index(TITLE)
