"""The gradient-cosine table of ``docs/composability.md``: low precision against float64.

For each ham (NMF, VQ, CD, SVD) and backward mode (OneStep, Unroll), the input gradient of
``sum(y * w)`` (w a fixed random weight) in bfloat16 / float16 is compared with float64 (cosine
similarity), from the same input (``torch.rand``) and the same initial bases, over ``--seeds``
seeds (min and mean reported), on two stated sizes: the test's (2, 8, 4, 4), rank 2, 3 steps
(``tests/lib/adjoints/test_precision.py``) and a user-sized (2, 64, 16, 16), rank 8, at the
ham's default steps. The ``Implicit`` row is the tanh fixed point of the same test, against the
dense float64 implicit-function formula.

VQ's and CD's logits are a similarity times ``inv_t = 100``: bfloat16's rounding of the
similarity (about 4e-3) would be an error of about 0.4 in the logits, so the library computes
them and their softmax in float32 for half-precision inputs
(``implicit_ham.decompositions.fused.similarity_softmax``); this table measures the result.

    python -m experiments.benchmarks.precision                       # print the table
    python -m experiments.benchmarks.precision --write docs/composability.md
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

import implicit_ham as ih
from experiments.reports.render import Table, replace_between

LOG = logging.getLogger(__name__)
BEGIN, END = "<!-- precision-table:begin -->", "<!-- precision-table:end -->"
SIZES = {"test": ((2, 8, 4, 4), 2, 3), "user": ((2, 64, 16, 16), 8, None)}
LOW = (torch.bfloat16, torch.float16)


def cosine(a: Tensor, b: Tensor) -> float:
    """Cosine similarity of two tensors, in float64."""
    return float(F.cosine_similarity(a.double().reshape(-1), b.double().reshape(-1), dim=0))


def ham_cosine(ham: type, adjoint: ih.plugins.Adjoint, dtype: torch.dtype, size: str,
               seed: int) -> float:  # fmt: skip
    """Input-gradient cosine of ``ham`` in ``dtype`` against float64 on the stated size."""
    shape, rank, steps = SIZES[size]
    gen = torch.Generator().manual_seed(seed)
    x64 = torch.rand(*shape, generator=gen, dtype=torch.float64)
    bases = F.normalize(torch.rand(shape[0], shape[1], rank, generator=gen,
                                   dtype=torch.float64), dim=1)  # fmt: skip
    weight = torch.randn(x64.shape, generator=gen, dtype=torch.float64)
    grads = []
    for dt in (torch.float64, dtype):
        kwargs = {"rank": rank, "adjoint": adjoint} | ({} if steps is None else {"steps": steps})
        layer = ham(**kwargs)
        x = x64.to(dt).requires_grad_()
        y = layer(x, init=bases.to(dt))
        (grad,) = torch.autograd.grad((y.double() * weight).sum(), x)
        grads.append(grad)
    return cosine(grads[1], grads[0])


def implicit_cosine(dtype: torch.dtype) -> float:
    """The tanh fixed point of test_precision: Implicit (GMRES, tol 1e-3) vs the float64
    implicit-function formula at the same (rounded) input."""
    gen = torch.Generator().manual_seed(0)
    W = torch.randn(8, 8, generator=gen, dtype=torch.float64) * 0.1
    x_low = torch.randn(4, 8, generator=gen, dtype=torch.float64).to(dtype)
    weight = torch.randn(4, 8, generator=gen, dtype=torch.float64)
    x = x_low.double()
    z = torch.zeros_like(x)
    for _ in range(200):
        z = torch.tanh(z @ W + x)
    s = 1 - z**2  # (4, 8): tanh' at z*
    eye = torch.eye(8, dtype=torch.float64)
    reference = torch.stack([
        s[i] * torch.linalg.solve((eye - W * s[i][None]), weight[i]) for i in range(4)
    ])  # fmt: skip
    xl = x_low.clone().requires_grad_()
    Wl = W.to(dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ih.ConvergenceWarning)
        zl = ih.fixed_point(lambda z, x: torch.tanh(z @ Wl + x), torch.zeros_like(xl), xl,
                            solver=ih.FixedPointIteration(max_steps=30),
                            adjoint=ih.Implicit(tol=1e-3, fixed_point_tol=2e-2)).value  # fmt: skip
        assert isinstance(zl, Tensor)
        (grad,) = torch.autograd.grad((zl.double() * weight).sum(), xl)
    return cosine(grad, reference)


def rows(seeds: int) -> list[list[str]]:
    """The table's rows: case, then per dtype and size 'min / mean' over the seeds."""
    table = [["`Implicit` on tanh(zW + x) (GMRES, tol 1e-3) vs the dense float64 IFT formula",
              *(f"{implicit_cosine(dt):.4f}" for dt in LOW), "", ""]]  # fmt: skip
    cases = [("NMF ham", ih.NMF), ("VQ ham", ih.VQ), ("CD ham", ih.CD), ("SVD ham", ih.SVD)]
    for name, ham in cases:
        for adjoint in (ih.OneStep(), ih.Unroll()):
            cells = [f"{name}, {adjoint.name}"]
            for size in ("test", "user"):
                for dt in LOW:
                    values = [ham_cosine(ham, adjoint, dt, size, s) for s in range(seeds)]
                    cells.append(f"{min(values):.4f} / {statistics.mean(values):.4f}")
            LOG.info("%s", " | ".join(cells))
            table.append(cells)
    return table


def markdown(table: list[list[str]], seeds: int) -> str:
    """The table with its header, stating the sizes and seeds."""
    header = ("case", "bf16, (2, 8, 4, 4) r=2", "fp16, (2, 8, 4, 4) r=2",
              "bf16, (2, 64, 16, 16) r=8", "fp16, (2, 64, 16, 16) r=8")  # fmt: skip
    lines = [
        f"Input-gradient cosine to float64, min / mean over {seeds} seeds (generated by "
        "`python -m experiments.benchmarks.precision --write docs/composability.md`; the "
        "Implicit row: one case):",
        "",
        *Table.of(header, table).markdown().splitlines(),
    ]
    # indented: the table sits in a list item (and test_func reads the page's top-level table)
    return "\n".join(f"  {line}" if line else "" for line in lines)


def write(path: Path, text: str) -> None:
    """Replace the block between the markers in ``path`` by ``text``."""
    path.write_text(replace_between(path.read_text(), f"{BEGIN}\n{text}\n{END}", BEGIN, END, path))


def main(argv: list[str] | None = None) -> int:
    """Measure and print the table; ``--write PAGE`` also puts it into the page."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--write", type=Path, default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(1)
    text = markdown(rows(args.seeds), args.seeds)
    LOG.info("%s", text)
    if args.write is not None:
        write(args.write, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
