"""The "Argmin hams" section of docs/results.md on a synthetic study folder: known runs in, known
cells and verdicts out; missing sweeps and rows are named."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from experiments.reports.study_ridge import TITLE, append_ridge_section, ridge_section

STEPS = 384
CONFIG = {"data": {"train_size": 512}, "batch_size": 16, "epochs": 12}
BLOB = {  # (sweep, context, adjoint) -> per-seed blob accuracy
    ("ridge", "nmf_ridge", "implicit"): [0.80, 0.82, 0.81],
    ("ridge", "nmf_ridge", "unroll"): [0.90, 0.92, 0.91],  # implicit 0.10 below: does not train
    ("ridge", "cd_ridge", "implicit"): [0.88, 0.90, 0.89],
    ("ridge", "cd_ridge", "unroll"): [0.89, 0.90, 0.91],  # 0.01 below, std 0.01: trains
    ("adjoints", "nmf", "implicit"): [0.24, 0.25, 0.26],
    ("adjoints", "nmf", "unroll"): [0.93, 0.94, 0.95],
}


def _study(root: Path) -> Path:
    nums: dict[str, int] = {}
    for (sweep, context, adjoint), values in BLOB.items():
        for seed, blob in enumerate(values):
            overrides = [f"context={context}", f"adjoint={adjoint}", f"seed={seed}"]
            if sweep == "adjoints":
                overrides.append("context.steps=6")
            missed = STEPS // 4 if adjoint == "implicit" else 0
            job = root / sweep / str(nums.setdefault(sweep, 0))
            nums[sweep] += 1
            (job / ".hydra").mkdir(parents=True)
            (job / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
            results = {
                "status": "ok",
                "config": CONFIG,
                "metrics": {"val/blob_acc": blob, "val/miou": blob - 0.1},
                "failures": {"by_kind": {"backward_not_fixed_point": missed}},
            }
            (job / "results.json").write_text(json.dumps(results))
    return root


def _cell(values: list[float]) -> str:
    return f"{statistics.fmean(values):.3f} ± {statistics.stdev(values):.3f}"


def test_the_table_holds_both_sweeps_and_the_failure_shares(tmp_path: Path) -> None:
    text = "\n".join(ridge_section(_study(tmp_path / "study")))
    ridge = BLOB[("ridge", "cd_ridge", "implicit")]
    miou = [v - 0.1 for v in ridge]
    assert f"| cd_ridge | implicit | {_cell(ridge)} | {_cell(miou)} | 0.0 % | 25.0 % |" in text
    nmf = BLOB[("adjoints", "nmf", "unroll")]
    assert f"| nmf | unroll | {_cell(nmf)} |" in text
    assert "cd implicit, cd one_step, cd unroll" in text  # missing from the adjoints sweep


def test_the_verdict_follows_the_numbers(tmp_path: Path) -> None:
    text = "\n".join(ridge_section(_study(tmp_path / "study")))
    assert "- nmf_ridge: the implicit gradient does not train as well as BPTT" in text
    assert "- cd_ridge: the implicit gradient trains as well as BPTT" in text
    assert "difference -0.100" in text and "(+0.560 for the argmin ham)" in text
    assert "plain CD's implicit arm (K = 6) is missing" in text


def test_a_missing_ridge_sweep_is_named_and_the_section_is_appended(tmp_path: Path) -> None:
    document = tmp_path / "results.md"
    document.write_text("# Results\n")
    append_ridge_section(document, tmp_path / "no_study")
    text = document.read_text()
    assert text.startswith("# Results\n" + TITLE)
    assert "Not run: the `ridge` sweep" in text
