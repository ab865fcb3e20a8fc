"""The GPU check (``python -m experiments.gpu_check``, ``make gpu-check``): what only a CUDA
device can confirm, written to ``docs/benchmarks_gpu.md``.

On CUDA it

(a) confirms the host-synchronisation behaviour of a fixed-budget forward with
    ``torch.cuda.set_sync_debug_mode``: a ``FixedPointIteration(tol=None, check_finite=False)``
    solve must make none ("error" mode raises on any), with ``check_finite`` one per solve, and a
    whole Hamburger forward a count that does not grow with K (counted in "warn" mode);
(b) measures fp16 / bf16 ``torch.autocast`` gradients of the Hamburger block (NMF, VQ, CD) and of
    a DEQ against float64 (cosines of the input and parameter gradients);
(c) times the Hamburger (v1, NMF, d = 512, r = 64, K = 6) training step against materialised
    self-attention at 1 x 512 x 128 x 128, with the peak ``torch.cuda.max_memory_allocated`` of
    each (the paper reports Ham at 1/15 of SA's time on GPU);
(d) times the ``LightHamHead`` at SegNeXt-T sizes on a 512 x 512 input;
(e) runs one DDP step with the nccl backend (world size 1).

Each part runs on its own: an exception is written to the page in its place, so one failure does
not hide the others. Without CUDA nothing is measured: the command says so, writes the page's
"not measured yet" text when the page is missing or still holds that text (a measured page is
left as it is), and exits 0. The measuring functions take the device and the sizes, so
tests/experiments/benchmarks/test_gpu_check.py runs (b) to (e) on the CPU at tiny sizes.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import logging
import socket
import time
import traceback
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

import implicit_ham as ih
from experiments.benchmarks.measure import MIB, interleaved_medians
from experiments.benchmarks.precision import cosine
from implicit_ham.diagnostics.table import markdown_table
from implicit_ham.nn import segnext_nmf

logger = logging.getLogger(__name__)

PAGE = Path(__file__).resolve().parents[2] / "docs" / "benchmarks_gpu.md"
NOT_MEASURED = "**Not measured yet.**"
Row = dict[str, Any]


@dataclass
class Section:
    """One part of the check: a title, what it measured (rows of one table) and notes; or the
    error that stopped it."""

    title: str
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    error: str | None = None


def run_section(title: str, measure: Callable[[], tuple[list[Row], list[str]]]) -> Section:
    """``measure()`` as a ``Section``; an exception becomes the section's error."""
    start = time.perf_counter()
    try:
        rows, notes = measure()
    except Exception:  # the page reports it; the other parts still run
        logger.exception("gpu check: %s failed", title)
        return Section(title, error=traceback.format_exc(limit=4))
    logger.info("gpu check: %s done in %.1f s", title, time.perf_counter() - start)
    return Section(title, rows, notes)


# --------------------------------------------------------------------- (a) host syncs


@contextmanager
def sync_debug(mode: str) -> Iterator[None]:
    """``torch.cuda.set_sync_debug_mode(mode)`` for the block, restored afterwards."""
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode(mode)
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(previous)


def count_syncs(fn: Callable[[], object]) -> int:
    """Host synchronisations ``fn`` makes, counted as the warnings of sync-debug mode "warn"."""
    with warnings.catch_warnings(record=True) as caught, sync_debug("warn"):
        warnings.simplefilter("always")
        fn()
    return sum("synchronizing" in str(w.message) for w in caught)


def host_syncs(device: torch.device, ks: Sequence[int] = (1, 6, 32)) -> tuple[list[Row], list[str]]:
    """(a): syncs of a fixed-budget solve (none, checked in "error" mode) and of a whole
    Hamburger forward (counted), for each K."""
    if device.type != "cuda":
        raise ValueError(f"host_syncs needs a CUDA device (sync-debug mode), got {device}")
    torch.manual_seed(0)
    x = torch.rand(2, 64, 32, 32, device=device)
    rows = []
    for k in ks:
        ham = ih.NMF(rank=8, channels=64, eval_init="fixed", eval_steps=k).to(device).eval()
        with torch.no_grad():
            problem = ham.implicit_problem(x)  # its input checks run outside the window
            quiet = ih.FixedPointIteration(max_steps=k, check_finite=False)
            try:
                with sync_debug("error"):  # raises at the first synchronising call
                    problem.solve(quiet, ih.OneStep())
                error_mode = "no sync (no error raised)"
            except RuntimeError as error:
                error_mode = f"raised: {str(error).splitlines()[0]}"
            checked = ih.FixedPointIteration(max_steps=k)
            solve_syncs = count_syncs(partial(problem.solve, checked, ih.OneStep()))
            block = ih.Hamburger(64, ham, "v2").to(device).eval()
            block_syncs = count_syncs(partial(block, x))
        rows.append(
            {
                "K": k,
                "solve, check_finite=False (error mode)": error_mode,
                "solve, check_finite=True (syncs)": solve_syncs,
                "Hamburger v2 NMF forward (syncs)": block_syncs,
            }
        )
    notes = [
        "A whole forward adds its input checks (one finiteness pass; NMF's non-negativity "
        "check) to the solver's one finiteness check; none of them grows with K.",
    ]
    return rows, notes


# ------------------------------------------------------------------ (b) mixed precision


def gradient(t: Tensor) -> Tensor:
    """``t.grad``, which the step before must have filled."""
    if t.grad is None:
        raise RuntimeError("gpu check: a tensor received no gradient")
    return t.grad


def gradient_cosines(
    module: nn.Module, x: Tensor, weight: Tensor, device: torch.device, dtype: torch.dtype
) -> tuple[float, float, str]:
    """Cosines to float64 of the input and parameter gradients of ``sum(weight * module(x))``
    with ``module`` under ``torch.autocast(dtype)`` (its float32 weights) and its float64 copy,
    and the library's warnings of the low-precision step (e.g. an implicit backward that missed
    its tolerance), by class name ("none" without any)."""
    reference = copy.deepcopy(module).double()
    grads = []
    caught: list[warnings.WarningMessage] = []
    for model, low in ((reference, False), (module, True)):
        leaf = x.to(torch.float32 if low else torch.float64).clone().requires_grad_()
        model.zero_grad(set_to_none=True)
        context = torch.autocast(device.type, dtype=dtype) if low else nullcontext()
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            with context:
                out = model(leaf)
            (out.double() * weight).sum().backward()
        if low:
            caught = [w for w in seen if issubclass(w.category, ih.errors.ConvergenceWarning)]
        params = torch.cat([gradient(p).double().flatten() for p in model.parameters()])
        grads.append((gradient(leaf), params))
    (ref_x, ref_p), (low_x, low_p) = grads
    names = sorted({w.category.__name__ for w in caught})
    return cosine(low_x, ref_x), cosine(low_p, ref_p), ", ".join(names) or "none"


class TanhDEQ(nn.Module):
    """z* = tanh(W z* + x) (30 plain iterations, the default implicit backward; ``||W||_2 =
    0.5``): the DEQ of the check. Its
    state stays in the input's dtype; under autocast the products run in the low precision."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.lin = nn.Linear(width, width)
        with torch.no_grad():
            self.lin.weight.mul_(0.5 / torch.linalg.matrix_norm(self.lin.weight, ord=2))

    def forward(self, x: Tensor) -> Tensor:
        solution = ih.fixed_point(
            lambda z, inp: torch.tanh(self.lin(z) + inp).to(z.dtype),
            torch.zeros_like(x),
            x,
            solver=ih.FixedPointIteration(max_steps=30),
            adjoint=ih.Implicit(),
        )
        value = solution.value
        assert isinstance(value, Tensor)  # a single-tensor state
        return value


def precision(
    device: torch.device,
    dtypes: Sequence[torch.dtype] = (torch.float16, torch.bfloat16),
    channels: int = 64,
    size: int = 32,
    rank: int = 8,
) -> tuple[list[Row], list[str]]:
    """(b): gradient cosines of autocast against float64 for the Hamburger block (NMF, VQ, CD;
    v2, training mode, ``init="fixed"`` so both precisions start from the same bases) and the
    DEQ."""
    rows = []
    cases: list[tuple[str, Callable[[], nn.Module], tuple[int, ...]]] = [
        (
            f"Hamburger v2 {kind.upper()}",
            partial(ih.make_context, kind, channels, rank=rank, init="fixed"),
            (2, channels, size, size),
        )
        for kind in ("nmf", "vq", "cd")
    ]
    cases.append(("DEQ tanh(Wz + x), Implicit", partial(TanhDEQ, channels), (32, channels)))
    for name, build, shape in cases:
        torch.manual_seed(0)
        module = build().to(device)
        g = torch.Generator(device=device).manual_seed(1)
        x = torch.rand(shape, generator=g, device=device, dtype=torch.float64)
        weight = torch.randn(shape, generator=g, device=device, dtype=torch.float64)
        row: Row = {"case": name}
        for dtype in dtypes:
            cos_x, cos_p, warned = gradient_cosines(module, x, weight, device, dtype)
            label = str(dtype).removeprefix("torch.")
            row[f"{label} input"], row[f"{label} params"] = cos_x, cos_p
            row[f"{label} warnings"] = warned
        rows.append(row)
    notes = [
        f"Cosine of the autocast gradient (float32 weights) to the float64 one; blocks on "
        f"2 x {channels} x {size} x {size}, rank {rank}, training mode; the DEQ on "
        f"32 x {channels}. Warnings: the library's convergence warnings raised by the "
        "low-precision step (e.g. an implicit backward that missed its tolerance).",
    ]
    return rows, notes


# ------------------------------------------------------------------------ (c), (d) timing


def peak_allocated(fn: Callable[[], object], device: torch.device) -> float | None:
    """Peak ``torch.cuda.max_memory_allocated`` (MiB) while ``fn`` runs, everything resident
    included (model, input); None off CUDA."""
    if device.type != "cuda":
        fn()
        return None
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) / MIB


def training_step(module: nn.Module, inputs: Any) -> Callable[[], None]:
    """A training step of ``module`` on ``inputs``: gradients reset, forward, ``sum`` backward."""

    def step() -> None:
        module.zero_grad(set_to_none=True)
        module(inputs).sum().backward()

    return step


def ham_versus_attention(
    device: torch.device,
    channels: int = 512,
    size: int = 128,
    rank: int = 64,
    repeats: int = 10,
    warmup: int = 3,
) -> tuple[list[Row], list[str]]:
    """(c): training step of Hamburger v1 (NMF, K = 6) and of materialised self-attention."""
    torch.manual_seed(0)
    modules = {
        "Hamburger v1 (NMF)": ih.make_context("nmf", channels, version="v1", rank=rank),
        "self-attention (materialised)": ih.make_context("self_attention", channels),
    }
    x = torch.randn(1, channels, size, size, device=device)
    steps = {name: training_step(m.to(device).train(), x) for name, m in modules.items()}
    times = interleaved_medians(steps, device, repeats=repeats, warmup=warmup)
    rows = [
        {
            "module": name,
            "train step (ms)": times[name],
            "peak allocated (MiB)": peak_allocated(step, device),
        }
        for name, step in steps.items()
    ]
    ham, sa = (times[name] for name in modules)
    notes = [
        f"1 x {channels} x {size} x {size}, float32, forward + backward of the output's sum; "
        f"median of {repeats} after {warmup} warm-up rounds. Ham / SA time: {ham / sa:.3f} "
        "(the paper: about 1/15 on GPU).",
    ]
    return rows, notes


def segnext_t_levels(
    batch: int, image: int, device: torch.device, in_channels: Sequence[int] = (32, 64, 160, 256)
) -> list[Tensor]:
    """Random MSCAN-T-shaped levels (strides 4, 8, 16, 32) of ``image`` x ``image`` inputs."""
    g = torch.Generator(device=device).manual_seed(0)
    return [
        torch.rand(batch, c, image // s, image // s, generator=g, device=device)
        for c, s in zip(in_channels, (4, 8, 16, 32), strict=True)
    ]


def light_ham_head_timing(
    device: torch.device,
    image: int = 512,
    batches: Sequence[int] = (1, 8),
    in_channels: Sequence[int] = (64, 160, 256),
    channels: int = 256,
    repeats: int = 10,
    warmup: int = 3,
) -> tuple[list[Row], list[str]]:
    """(d): the SegNeXt-T ``LightHamHead`` (R = 16, 150 classes): evaluation forward and
    training step on ``image`` x ``image`` inputs."""
    torch.manual_seed(0)
    head = ih.LightHamHead(
        list(in_channels),
        channels,
        num_classes=150,
        in_index=[1, 2, 3],
        ham_channels=channels,
        ham=segnext_nmf(channels, eval_init="fixed"),
    ).to(device)
    rows = []
    for batch in batches:
        levels = segnext_t_levels(batch, image, device, (32, *in_channels))

        def infer(levels: list[Tensor] = levels) -> None:
            head.eval()
            with torch.no_grad():
                head(levels)

        def train(levels: list[Tensor] = levels) -> None:
            head.train()
            training_step(head, levels)()

        times = interleaved_medians(
            {"eval": infer, "train": train}, device, repeats=repeats, warmup=warmup
        )
        rows.append(
            {
                "batch": batch,
                "eval forward (ms)": times["eval"],
                "train step (ms)": times["train"],
                "train peak allocated (MiB)": peak_allocated(train, device),
            }
        )
    parameters = sum(p.numel() for p in head.parameters())
    notes = [
        f"Levels of a {image} x {image} image (the head reads strides 8, 16, 32: "
        f"{image // 8} x {image // 8} output); {parameters:,} parameters; float32; median of "
        f"{repeats} after {warmup} warm-up rounds.",
    ]
    return rows, notes


# ---------------------------------------------------------------------------- (e) DDP


def free_port() -> int:
    """A TCP port of the loopback interface that is free now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ddp_step(device: torch.device, backend: str = "nccl") -> tuple[list[Row], list[str]]:
    """(e): one DistributedDataParallel training step (world size 1) of a Hamburger block on
    ``backend``; its gradients against the same step without DDP."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    model = ih.make_context("nmf", 32, rank=4, init="fixed").to(device)
    plain = copy.deepcopy(model)
    x = torch.rand(2, 32, 16, 16, device=device)
    kwargs: dict[str, Any] = {"device_id": device} if device.type == "cuda" else {}
    address = f"tcp://127.0.0.1:{free_port()}"
    dist.init_process_group(backend, init_method=address, rank=0, world_size=1, **kwargs)
    try:
        wrapped = DistributedDataParallel(
            model, device_ids=[device.index or 0] if device.type == "cuda" else None
        )
        optimiser = torch.optim.SGD(wrapped.parameters(), lr=0.1)
        start = time.perf_counter()
        loss = wrapped(x).square().mean()
        loss.backward()
        optimiser.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds = time.perf_counter() - start
        plain(x).square().mean().backward()
        difference = max(
            float((gradient(p) - gradient(q)).abs().max())
            for p, q in zip(model.parameters(), plain.parameters(), strict=True)
        )
        world = dist.get_world_size()
    finally:
        dist.destroy_process_group()
    rows = [
        {
            "backend": backend,
            "world size": world,
            "loss": float(loss.detach()),
            "step (s)": seconds,
            "max abs difference of the gradients (DDP vs plain)": difference,
        }
    ]
    notes = [
        "One forward, backward (gradient all-reduce) and SGD step of a Hamburger v2 NMF block "
        "on 2 x 32 x 16 x 16; the time includes DDP's first-step bucket set-up.",
    ]
    return rows, notes


# ---------------------------------------------------------------------------------- page


def render(sections: Sequence[Section], header: Sequence[str]) -> str:
    """The markdown page: a header, then each section's table and notes (or its error)."""
    lines = ["# GPU check", "", *header, ""]
    for section in sections:
        lines += [f"## {section.title}", ""]
        if section.error is not None:
            lines += ["Failed:", "", "```text", section.error.rstrip(), "```", ""]
            continue
        if section.rows:
            columns = list(dict.fromkeys(k for row in section.rows for k in row))
            body = [[row.get(c) for c in columns] for row in section.rows]
            lines += [markdown_table(columns, body, missing="–"), ""]
        lines += [*section.notes, ""] if section.notes else []
    return "\n".join(lines).rstrip() + "\n"


def not_measured_page() -> str:
    """The page before any GPU run."""
    return (
        "# GPU check\n\n"
        f"{NOT_MEASURED} No CUDA device has run `make gpu-check` "
        "(`python -m experiments.gpu_check`) for this page yet; every performance and "
        "precision figure elsewhere in the docs is CPU-only. On a CUDA machine the command "
        "measures (sized to finish in under 8 minutes on one GPU; not yet timed on one):\n\n"
        "- (a) the host synchronisations of a fixed-budget forward "
        "(`torch.cuda.set_sync_debug_mode`);\n"
        "- (b) fp16 / bf16 autocast gradient cosines of the Hamburger block (NMF, VQ, CD) and "
        "of a DEQ against float64;\n"
        "- (c) the Hamburger v1 training step against materialised self-attention at "
        "1 x 512 x 128 x 128, with peak `torch.cuda.max_memory_allocated`;\n"
        "- (d) the LightHamHead at SegNeXt-T sizes on a 512 x 512 input;\n"
        "- (e) one DDP step with the nccl backend;\n\n"
        "then it rewrites this page.\n"
    )


def measure_all(device: torch.device) -> list[Section]:
    """Parts (a) to (e) on ``device`` at the sizes of the page."""
    parts: dict[str, Callable[[torch.device], tuple[list[Row], list[str]]]] = {
        "(a) Host synchronisations of a fixed-budget forward": host_syncs,
        "(b) Mixed-precision gradients against float64": precision,
        "(c) Hamburger against materialised self-attention": ham_versus_attention,
        "(d) LightHamHead at SegNeXt-T sizes": light_ham_head_timing,
        "(e) One DDP step (nccl)": ddp_step,
    }
    return [run_section(title, partial(measure, device)) for title, measure in parts.items()]


def header(device: torch.device, seconds: float) -> list[str]:
    """Where and when the page was measured."""
    today = datetime.date.today().isoformat()
    return [
        f"Measured by `make gpu-check` on {today}: {torch.cuda.get_device_name(device)}, "
        f"torch {torch.__version__}, CUDA {torch.version.cuda}; the whole check took "
        f"{seconds:.0f} s.",
    ]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.gpu_check",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--output", type=Path, default=PAGE, help="the page to write")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the check on CUDA and write the page; without CUDA say so and exit 0."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    args = parse_args(argv)
    if not torch.cuda.is_available():
        logger.info("gpu check: no CUDA device here, nothing measured.")
        page: Path = args.output
        if not page.exists() or NOT_MEASURED in page.read_text():
            page.write_text(not_measured_page())
            logger.info("gpu check: %s states that it has not been measured yet.", page)
        else:
            logger.info("gpu check: %s holds measurements; left as it is.", page)
        return 0
    device = torch.device("cuda", torch.cuda.current_device())
    start = time.perf_counter()
    sections = measure_all(device)
    args.output.write_text(render(sections, header(device, time.perf_counter() - start)))
    logger.info("gpu check: wrote %s", args.output)
    return 0
