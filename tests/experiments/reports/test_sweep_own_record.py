"""The sweep report reads each job's arm from its own record of what it trained and refuses
results that do not belong to the rows beside them (issue 47 item 7(b)): a finished job run
again with ``reliability.resume=false`` and other settings, then killed, keeps its old ok
``results.json`` beside the new run's rows and Hydra's new ``.hydra/`` files."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import yaml
from helpers.train_jobs import run_train, start_train, train_rows, wait_for

from experiments.engine.log_record import log_record, logs_mismatch
from experiments.reports.sweep import metrics_table, write_report
from experiments.reports.sweep_jobs import collect_jobs, group_jobs


def _job(root: Path, num: int, rank: int, adjoint: str = "implicit") -> Path:
    """A finished job as the engine leaves it: .hydra/ files, rows, results.json with logs."""
    job = root / str(num)
    (job / ".hydra").mkdir(parents=True)
    config = {"seed": 0, "context": {"name": "nmf", "rank": rank},
              "adjoint": {"_target_": f"implicit_ham.{adjoint.title()}"}}  # fmt: skip
    _launch(job, config, [f"context.rank={rank}", f"adjoint={adjoint}", "seed=0"])
    (job / "metrics.jsonl").write_text('{"step": 2, "epoch": 1, "val/blob_acc": 0.5}\n')
    body = {"status": "ok", "config": config, "metrics": {"val/blob_acc": 0.5}}
    (job / "results.json").write_text(json.dumps({**body, "logs": log_record(job)}))
    return job


def _launch(job: Path, config: dict, overrides: list[str]) -> None:
    """What Hydra writes into the job's .hydra/ at every launch."""
    (job / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    (job / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))


def test_results_whose_rows_were_rewritten_are_stale_not_ok(tmp_path: Path) -> None:
    kept = _job(tmp_path, 0, rank=4)
    job = _job(tmp_path, 1, rank=4)
    # a later run with other settings: Hydra rewrites .hydra/, the run rewrites the rows, dies
    _launch(job, {"seed": 0, "context": {"name": "nmf", "rank": 8},
                  "adjoint": {"_target_": "implicit_ham.Implicit"}},
            ["context.rank=8", "adjoint=implicit", "seed=0"])  # fmt: skip
    (job / "metrics.jsonl").write_text('{"step": 0, "train/loss": 3.0}\n')
    assert logs_mismatch(kept, log_record(kept)) is None
    assert "metrics.jsonl rewritten (1 rows, 1 then)" in (logs_mismatch(job, log_record(kept))
                                                          or "")  # fmt: skip
    jobs = {j.directory.name: j for j in collect_jobs(tmp_path)}
    assert jobs["0"].status == "ok"
    assert jobs["1"].status == "stale" and "did not finish" in (jobs["1"].error or "")
    table = metrics_table(group_jobs(jobs.values()), ["val/blob_acc"]).markdown()
    assert "| 8 | 0/1 | – |" in table  # the new settings are not reported as an ok result
    assert "| 4 | 1/1 | 0.500 |" in table


def test_an_ok_job_is_labelled_by_the_config_it_trained(tmp_path: Path) -> None:
    job = _job(tmp_path, 0, rank=4)
    _job(tmp_path, 1, rank=2)
    # a refused later command rewrote .hydra/ only (the rows and results are the job's own)
    _launch(job, {"seed": 0, "context": {"name": "nmf", "rank": 8},
                  "adjoint": {"_target_": "implicit_ham.Implicit"}},
            ["context.rank=8", "adjoint=implicit", "seed=0"])  # fmt: skip
    jobs = {j.directory.name: j for j in collect_jobs(tmp_path)}
    assert jobs["0"].status == "ok" and jobs["0"].overrides["context.rank"] == "4"
    text = write_report(tmp_path, tmp_path / "out").read_text()
    assert "## Jobs relabelled from their own record" in text
    assert "context.rank=8" in text.split("relabelled from their own record")[1]


def test_a_job_whose_arm_cannot_be_recovered_is_set_aside(tmp_path: Path) -> None:
    job = _job(tmp_path, 0, rank=4)
    _launch(job, {"seed": 0, "context": {"name": "nmf", "rank": 4},
                  "adjoint": {"_target_": "implicit_ham.Unroll"}},
            ["context.rank=4", "adjoint=unroll", "seed=0"])  # a config group: no value to map
    (found,) = collect_jobs(tmp_path)
    assert found.status == "mislabelled" and "adjoint._target_" in (found.error or "")


ARGS = ["epochs=2", "data.train_size=16", "data.val_size=8", "data.image_size=32",
        "data.num_classes=3", "context.steps=2", "context.eval_steps=2", "batch_size=8",
        "progress=false", "threads=1", "adjoint=implicit"]  # fmt: skip


@pytest.mark.slow
def test_a_killed_restart_with_new_settings_is_not_reported_ok(tmp_path: Path) -> None:
    job = tmp_path / "0"
    first = run_train(job, ARGS, "context.rank=4")
    assert first.returncode == 0, first.stderr[-3000:]
    assert collect_jobs(tmp_path)[0].status == "ok"
    finished = (job / "metrics.jsonl").read_text()

    def new_rows() -> bool:  # the new run cut the old rows and logged one of its own
        rows = job / "metrics.jsonl"
        return rows.exists() and rows.read_text() != finished and train_rows(job) >= 1

    again = start_train(job, ARGS, "context.rank=8", "epochs=50", "reliability.resume=false")
    wait_for(again, new_rows)
    os.kill(again.pid, signal.SIGKILL)
    again.wait(timeout=60)
    assert json.loads((job / "results.json").read_text())["status"] == "ok"  # the old one
    (found,) = collect_jobs(tmp_path)
    assert found.status == "stale", found.error
    assert "metrics.jsonl rewritten" in (found.error or "")
