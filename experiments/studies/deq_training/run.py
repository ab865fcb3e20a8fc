"""A DEQ training study on the 8x8 digits: what keeps a convolutional DEQ contractive.

A small MDEQ-like classifier (single scale): a convolution stem and injection, the fixed-point
cell ``z = GroupNorm(ReLU(gain * conv(z) + x))`` solved by ``ih.fixed_point`` (Anderson forward,
implicit backward), a 2x2-pooled linear head. It is trained on the experiments' ``Trainer``
(``experiments.engine.trainer``) with the library's stabilisers, one arm each and a combination:

* ``none``: no stabilisation;
* ``jacobian``: ``+ w * ih.jacobian_penalty(cell, z*, x)`` (Hutchinson ``||J||_F^2 / numel``);
* ``spectral``: ``ih.nn.apply_norm(cell, "spectral")`` on the cell's convolution;
* ``correction``: ``ih.fixed_point(..., states=[...])`` and ``ih.fixed_point_correction`` of the
  loss over the intermediate states and the solution;
* ``combined``: the Jacobian penalty with the spectral norm (the two stabilisers that kept
  ρ(J) below 1 in exploratory single-seed runs of the single arms).

Before training, every ``probe_every`` steps and at the end, a fixed probe batch is solved
tightly and the conditioning of the cell at its fixed point is measured
(``ih.diagnostics.estimate_conditioning``: ρ(J), κ(I - J)), with the test accuracy. Every
training step records its loss, the forward steps, whether the forward solve reached its
tolerance, whether the backward was at a fixed point and converged (from ``Solution.stats`` /
``backward_log``), the warnings the library issued (counted with
``warnings.catch_warnings(record=True)``), and its wall time.

One job per (arm, seed), written to ``OUT/jobs/<arm>_seed<seed>.json`` when it finishes, and
its row (``deq_training.rows``: numbers, curves, configuration, processor, threads, commit)
appended to the committed CSV as it ends; a job with a row (or a job file) of the same
configuration is skipped, so an interrupted study resumes, also on a fresh machine.

    OMP_NUM_THREADS=1 python -m experiments.studies.deq_training.run [OUT_DIR] \
        --csv docs/deq_training/runs.csv [--workers 2]
    python -m experiments.report --deq docs/deq_training/runs.csv   # docs/deq_training.md
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import time
import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils import parametrize

import implicit_ham as ih
from experiments.data.digits import NUM_CLASSES, DigitsDataset
from experiments.engine.callbacks import Callback
from experiments.engine.job_record import write_job_record
from experiments.engine.provenance import provenance
from experiments.engine.state import TrainState
from experiments.engine.task import Task
from experiments.engine.tensor_batches import PermutationBatches
from experiments.engine.trainer import Trainer
from experiments.models.deq1d import ConvCell
from experiments.studies.deq_training.rows import (
    DEFAULT_CSV,
    append_row,
    config_text,
    job_row,
    read_rows,
)
from experiments.studies.job_runner import Schedule, run_schedule

logger = logging.getLogger(__name__)

DEFAULT_OUT = Path("multirun/deq_training")


@dataclass(frozen=True)
class Arm:
    """Which stabilisers an arm uses."""

    title: str
    jacobian: bool = False
    spectral: bool = False
    correction: bool = False


ARMS: dict[str, Arm] = {
    "none": Arm("no stabilisation"),
    "jacobian": Arm("Jacobian penalty", jacobian=True),
    "spectral": Arm("spectral norm", spectral=True),
    "correction": Arm("fixed-point correction", correction=True),
    "combined": Arm("Jacobian penalty + spectral norm", jacobian=True, spectral=True),
}


@dataclass(frozen=True)
class StudyConfig:
    """Everything a job depends on (its JSON file stores it; a changed config is not resumed).

    Attributes:
        arms, seeds: the jobs (every arm with every seed).
        steps: Adam steps per job; batch the training batch size.
        lr: Adam's learning rate; conv_lr that of the cell's convolution (with ``gain`` it
            sets how fast ``gain * W`` moves: Adam's steps do not scale with the gradient).
        width, groups: channels of the state and GroupNorm groups.
        gain: a constant factor on the cell's convolution, the same in every arm (a small value
            starts the map contractive: the injection dominates the GroupNorm's statistics; the
            spectral norm then bounds ``||gain * W||`` by ``gain``).
        forward_steps, forward_tol: the Anderson forward solve's budget and relative tolerance.
        backward_steps, backward_tol: the implicit backward's GMRES budget and tolerance.
        jacobian_weight: weight of the Jacobian penalty (arms ``jacobian``, ``combined``).
        correction_states: evaluation indices of the states the correction is computed on
            (arm ``correction``), in [1, forward_steps].
        probe_every: steps between probes (conditioning and test accuracy); also before the
            first step and after the last.
        probe_size: images in the probe batch (the first of the test split).
        probe_steps: Anderson budget of the probe's tight solve (tolerance 1e-6).
        threads: torch threads per job.
    """

    arms: tuple[str, ...] = tuple(ARMS)
    seeds: tuple[int, ...] = (0, 1, 2)
    steps: int = 200
    lr: float = 5e-3
    conv_lr: float = 5e-2
    batch: int = 64
    width: int = 16
    groups: int = 4
    gain: float = 0.1
    forward_steps: int = 30
    forward_tol: float = 1e-3
    backward_steps: int = 40
    backward_tol: float = 1e-4
    jacobian_weight: float = 2.0
    correction_states: tuple[int, ...] = (5, 10)
    probe_every: int = 25
    probe_size: int = 32
    probe_steps: int = 150
    threads: int = 1

    def __post_init__(self) -> None:
        unknown = [a for a in self.arms if a not in ARMS]
        if unknown or not self.arms:
            raise ValueError(f"StudyConfig: unknown arms {unknown}; valid arms: {list(ARMS)}")
        if not self.seeds:
            raise ValueError("StudyConfig: seeds must name at least one seed")
        bad = [i for i in self.correction_states if not 1 <= i <= self.forward_steps]
        if bad:
            raise ValueError(
                f"StudyConfig: correction_states {bad} must lie in [1, forward_steps="
                f"{self.forward_steps}]"
            )

    def job_key(self) -> dict[str, Any]:
        """The settings a job's results depend on (not the list of arms and seeds)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if k not in ("arms", "seeds")}


class DEQClassifier(nn.Module):
    """Stem and injection -> the DEQ cell's fixed point -> global average pool -> linear head."""

    def __init__(self, width: int, groups: int, gain: float) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(1, width, 3, padding=1), nn.GroupNorm(groups, width), nn.ReLU()
        )
        self.inject = nn.Conv2d(width, width, 1)
        self.cell = ConvCell(width, groups, gain, dims=2)  # GroupNorm(ReLU(gain conv3x3(z) + x))
        self.head = nn.Linear(width * 16, NUM_CLASSES)

    def injection(self, images: Tensor) -> Tensor:
        """images (B, 1, 8, 8) -> x (B, C, 8, 8), the cell's input."""
        return self.inject(self.stem(images))

    def classify(self, z: Tensor) -> Tensor:
        """z (B, C, 8, 8) -> 2x2 average pool (B, C, 4, 4) -> logits (B, 10)."""
        return self.head(F.avg_pool2d(z, 2).flatten(1))


def load_split(split: str) -> tuple[Tensor, Tensor]:
    """The digits' images (N, 1, 8, 8) and labels (N,) of "train" or "val" (fixed split)."""
    data = DigitsDataset(split, seed=0)
    return data.images, data.labels


def _forward_solver(config: StudyConfig) -> ih.Anderson:
    return ih.Anderson(max_steps=config.forward_steps, tol=config.forward_tol, m=5)


def accuracy(model: DEQClassifier, images: Tensor, labels: Tensor, config: StudyConfig) -> float:
    """Test accuracy in eval mode (no gradient), in chunks of 128 images."""
    model.eval()
    correct = 0
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # evaluation solves are not training events
        for start in range(0, len(images), 128):
            x = model.injection(images[start : start + 128])
            sol = ih.fixed_point(model.cell, torch.zeros_like(x), x, solver=_forward_solver(config))
            logits = model.classify(sol.value)  # type: ignore[arg-type]
            correct += int((logits.argmax(1) == labels[start : start + 128]).sum())
    model.train()
    return correct / len(images)


def probe(model: DEQClassifier, images: Tensor, config: StudyConfig) -> dict[str, float]:
    """ρ(J), κ(I - J) and the residual at the probe batch's fixed point (a tight Anderson solve,
    eval mode, the parametrised weights computed once), and the steps that solve took."""
    model.eval()
    solver = ih.Anderson(max_steps=config.probe_steps, tol=1e-6, m=5)
    with torch.no_grad(), warnings.catch_warnings(), parametrize.cached():
        warnings.simplefilter("ignore")  # the probe's own solves are not training events
        x = model.injection(images)
        sol = ih.fixed_point(model.cell, torch.zeros_like(x), x, solver=solver)
        report = ih.diagnostics.estimate_conditioning(
            model.cell, sol.value, x, krylov_dim=20, restarts=2, lanczos_steps=20,
            inverse_steps=1, inner_steps=40,
        )  # fmt: skip
    model.train()
    return {
        "spectral_radius": report.spectral_radius,
        "kappa": report.kappa,
        "sigma_min": report.sigma_min,
        "fixed_point_residual": report.fixed_point_residual,
        "probe_solve_steps": float(sol.stats.steps),
    }


def _loss(
    model: DEQClassifier, images: Tensor, labels: Tensor, arm: Arm, config: StudyConfig
) -> tuple[Tensor, ih.Solution]:
    """The arm's training loss on one batch and the solve it came from."""
    x = model.injection(images)
    states = list(config.correction_states) if arm.correction else None
    sol = ih.fixed_point(
        model.cell, torch.zeros_like(x), x, solver=_forward_solver(config),
        adjoint=ih.Implicit(max_steps=config.backward_steps, tol=config.backward_tol),
        states=states,
    )  # fmt: skip

    def task(z: Any) -> Tensor:
        return F.cross_entropy(model.classify(z), labels)

    if arm.correction:  # the states carry one-step gradients, the solution the implicit one
        loss = ih.fixed_point_correction(task, [*sol.states, sol.value], "exp")
    else:
        loss = task(sol.value)
    if arm.jacobian:
        loss = loss + config.jacobian_weight * ih.jacobian_penalty(model.cell, sol.value, x)
    return loss, sol


def _step_record(sol: ih.Solution, caught: list[warnings.WarningMessage]) -> dict[str, Any]:
    """What one training step says about its solves: forward steps and convergence, the
    backward's fixed-point check and convergence, and the warnings issued, by class."""
    converged = sol.stats.converged
    back = sol.backward_log
    return {
        "forward_steps": float(sol.stats.steps),
        "forward_converged": bool(converged is None or bool(converged.all())),
        "backward_at_fixed_point": all(b.at_fixed_point is not False for b in back),
        "backward_converged": all(b.converged is not False for b in back),
        "warnings": dict(Counter(w.category.__name__ for w in caught)),
    }


def build(config: StudyConfig, arm: Arm) -> tuple[DEQClassifier, torch.optim.Optimizer]:
    """The arm's model (spectral norm on the cell's convolution where the arm says so) and its
    Adam optimiser (the convolution at ``conv_lr``, the rest at ``lr``)."""
    model = DEQClassifier(config.width, config.groups, config.gain)
    if arm.spectral:
        ih.nn.apply_norm(model.cell, "spectral")
    conv = list(model.cell.conv.parameters())
    rest = [p for p in model.parameters() if all(p is not q for q in conv)]
    groups: list[dict[str, Any]] = [{"params": conv, "lr": config.conv_lr}, {"params": rest}]
    return model, torch.optim.Adam(groups, lr=config.lr)


def train_step(
    model: DEQClassifier,
    optimizer: torch.optim.Optimizer,
    batch: tuple[Tensor, Tensor],
    arm: Arm,
    config: StudyConfig,
) -> dict[str, Any]:
    """One Adam step on ``batch`` (images, labels); its record (loss, time, ``_step_record``)."""
    tic = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loss, sol = _loss(model, *batch, arm, config)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    record = {"loss": float(loss.detach()), "time_s": time.perf_counter() - tic}
    return {**record, **_step_record(sol, caught)}


class StepFailedError(RuntimeError):
    """A training step raised ``ih.NonFiniteError``; the message names the step (1-based)."""


class JobLog(Callback):
    """A job's ``Trainer`` step and its records. The step (``__call__``): ``train_step`` on the
    batch, its record kept in ``last``; an ``ih.NonFiniteError`` becomes ``StepFailedError``
    ("step N: ..."). The callback: every step's record (``last`` with its 1-based ``step``)
    and the probes (``measure(step)``) before the first step, every ``probe_every`` steps and
    after the last."""

    def __init__(
        self,
        model: DEQClassifier,
        optimizer: torch.optim.Optimizer,
        arm: Arm,
        config: StudyConfig,
        measure: Callable[[int], dict[str, Any]],
    ) -> None:
        self.model, self.optimizer, self.arm, self.config = model, optimizer, arm, config
        self.measure = measure
        self.last: dict[str, Any] = {}
        self.steps: list[dict[str, Any]] = []
        self.probes: list[dict[str, Any]] = []

    def __call__(self, images: Tensor, labels: Tensor, index: int) -> Tensor:
        """One step on (images, labels), the job's ``index``-th (0-based); its loss."""
        try:
            self.last = train_step(
                self.model, self.optimizer, (images, labels), self.arm, self.config
            )
        except ih.NonFiniteError as error:
            raise StepFailedError(f"step {index + 1}: {error}") from error
        return torch.as_tensor(self.last["loss"])

    def on_fit_start(self, trainer: Trainer, state: TrainState) -> None:
        """The probe before training."""
        self.probes.append(self.measure(state.step))

    def on_step_end(self, trainer: Trainer, state: TrainState, loss: Tensor | None) -> None:
        """Record the step; probe when due."""
        self.steps.append({"step": state.step, **self.last})
        if state.step % self.config.probe_every == 0 or state.step == self.config.steps:
            self.probes.append(self.measure(state.step))


def run_job(config: StudyConfig, arm_name: str, seed: int, out_dir: Path) -> dict[str, Any]:
    """Train one (arm, seed) on the ``Trainer`` (one epoch of ``config.steps`` batches; the
    step, its records and the probes in ``JobLog``) and write
    ``out_dir/jobs/<arm>_seed<seed>.json``; returns it. A non-finite value
    (``ih.NonFiniteError``) ends the job early; the file records it.
    """
    torch.set_num_threads(config.threads)
    where = provenance()  # the processor, this job's threads, the library commit
    arm = ARMS[arm_name]
    torch.manual_seed(seed)
    (train_x, train_y), (test_x, test_y) = load_split("train"), load_split("val")
    model, optimizer = build(config, arm)

    def measure(index: int) -> dict[str, Any]:
        return {"step": index, **probe(model, test_x[: config.probe_size], config),
                "test_accuracy": accuracy(model, test_x, test_y, config)}  # fmt: skip

    log = JobLog(model, optimizer, arm, config, measure)
    trainer = Trainer(
        model, Task("classification", NUM_CLASSES), log, device=torch.device("cpu"),
        callbacks=[log],
    )  # fmt: skip
    failure: str | None = None
    start = time.perf_counter()
    try:
        trainer.fit(PermutationBatches(train_x, train_y, config.steps, config.batch, seed), None, 1)
    except StepFailedError as error:
        failure = str(error)
        logger.warning("%s seed %d stopped: %s", arm_name, seed, failure)
    result = {
        "arm": arm_name,
        "seed": seed,
        "config": config.job_key(),
        "steps": log.steps,
        "probes": log.probes,
        "failure": failure,
        "final_test_accuracy": None if failure else log.probes[-1]["test_accuracy"],
        "wall_s": time.perf_counter() - start,
        "provenance": where,
    }
    path = job_path(out_dir, arm_name, seed)  # written atomically: it exists once the job ended
    write_job_record(path.parent, {path.name: json.dumps(result, indent=1)})
    return result


def job_path(out_dir: Path, arm: str, seed: int) -> Path:
    """Where the job (arm, seed) writes its results."""
    return Path(out_dir) / "jobs" / f"{arm}_seed{seed}.json"


def finished(config: StudyConfig, out_dir: Path, arm: str, seed: int) -> bool:
    """Whether the job's file exists; a file written under another configuration is an error
    (mixing them would make the page compare unlike runs)."""
    path = job_path(out_dir, arm, seed)
    if not path.exists():
        return False
    stored = json.loads(path.read_text())["config"]
    if stored != json.loads(json.dumps(config.job_key())):
        raise ValueError(
            f"{path} was written with another configuration ({stored}); remove it or use "
            "another output folder"
        )
    return True


@dataclass(frozen=True)
class Job:
    """One job of the study: an arm at a seed."""

    arm: str
    seed: int

    @property
    def key(self) -> str:
        """The job's name, ``<arm>_seed<seed>``."""
        return f"{self.arm}_seed{self.seed}"


def _job_row(job: Job, config: StudyConfig, out_dir: Path) -> dict[str, Any]:
    """Run ``job`` (``run_job``, in a worker process) and return its CSV row."""
    result = run_job(config, job.arm, job.seed, out_dir)
    return job_row(result, result["provenance"])


def run_study(
    config: StudyConfig, out_dir: Path, workers: int = 1, csv_path: str | Path | None = None
) -> dict[str, list[str]]:
    """Run every (arm, seed) job without a row in ``csv_path`` (default ``out_dir/runs.csv``),
    ``workers`` at a time (1: in this process; ``job_runner.run_schedule``), appending each
    job's row as it ends. A job whose file exists in ``out_dir`` but has no row gets its row
    from the file, unrun.

    Returns the job names that ran and those skipped (a row or a job file existed).

    Raises:
        ValueError: a row or job file of the same (arm, seed) has another configuration.
    """
    out_dir = Path(out_dir)
    csv_path = Path(csv_path) if csv_path is not None else out_dir / "runs.csv"
    key = config_text(config.job_key())
    rows = {(r["arm"], r["seed"]): r for r in read_rows(csv_path)}
    jobs = [Job(a, s) for a in config.arms for s in config.seeds]
    todo = []
    for job in jobs:
        row = rows.get((job.arm, job.seed))
        if row is not None and row["config"] != key:
            raise ValueError(
                f"{csv_path}: the row of {job.arm} seed {job.seed} has another configuration "
                f"({row['config']}); remove it or use another CSV"
            )
        if row is None and finished(config, out_dir, job.arm, job.seed):  # checks its config
            result = json.loads(job_path(out_dir, job.arm, job.seed).read_text())
            append_row(csv_path, job_row(result, result.get("provenance", {})))
        elif row is None:
            todo.append(job)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(dataclasses.asdict(config), indent=1))
    schedule = Schedule(
        pending=lambda _: todo,
        run=_job_row,
        args=(config, out_dir),
        write=lambda _, row: append_row(csv_path, row),
    )
    run_schedule(schedule, {}, workers)  # a signal: no new job starts, those in flight finish
    return {"ran": [j.key for j in todo], "skipped": [j.key for j in jobs if j not in todo]}


def main(argv: Sequence[str] | None = None) -> None:
    """Run the study (resumable) into OUT_DIR."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", nargs="?", default=str(DEFAULT_OUT))
    parser.add_argument("--csv", default=str(DEFAULT_CSV), help="the rows (committed; resumed)")
    parser.add_argument("--workers", type=int, default=2, help="jobs run at once")
    parser.add_argument("--steps", type=int, default=None, help="override the steps per job")
    parser.add_argument("--seeds", type=int, nargs="*", default=None)
    parser.add_argument("--arms", nargs="*", default=None, choices=list(ARMS))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    overrides: dict[str, Any] = {}
    if args.steps is not None:
        overrides["steps"] = args.steps
    if args.seeds:
        overrides["seeds"] = tuple(args.seeds)
    if args.arms:
        overrides["arms"] = tuple(args.arms)
    config = StudyConfig(**overrides)
    done = run_study(config, Path(args.out_dir), args.workers, args.csv)
    logger.info("ran %s; skipped (already finished) %s", done["ran"], done["skipped"])


if __name__ == "__main__":
    main()
