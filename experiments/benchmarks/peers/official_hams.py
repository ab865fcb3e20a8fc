"""The official Hamburger formulation of the NMF, VQ and CD hams, re-implemented from the
equations (``/work/shared/hamburger.md`` §2 and §6), as the peer ``bench_peers`` measures the
library's hams against. Not a copy of the official (GPL) code: a plain transcription of what it
computes, in its order:

* the input (B, C, H, W) is viewed as X (B*S, d, n); fresh random bases per forward (uniform
  [0, 1) for NMF, standard normal for VQ / CD), ``F.normalize`` over d;
* under ``torch.no_grad()``: ``C0 = softmax_r(inv_t X^T D0)``, then K ``local_step`` s written
  with ``torch.bmm`` (VQ and CD normalise X with ``F.normalize`` inside every step);
* with gradient: ``compute_coef`` (NMF: one more C update; VQ: the softmax with ``||X||`` taken
  without gradient; CD: ``X^T D (D^T D + beta I)^-1`` with an explicit inverse), then
  ``bmm(D, C^T)`` with the (detached) bases.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class OfficialHam(nn.Module):
    """Base: the shared forward of the official ``_MatrixDecomposition2DBase`` (S = 1)."""

    inv_t: float = 1.0
    nonnegative = False

    def __init__(self, rank: int = 64, steps: int = 6, eval_steps: int = 6) -> None:
        super().__init__()
        self.rank, self.steps, self.eval_steps = rank, steps, eval_steps

    def build_bases(self, count: int, d: int, like: Tensor) -> Tensor:
        draw = torch.rand if self.nonnegative else torch.randn
        bases = draw(count, d, self.rank, device=like.device, dtype=like.dtype)
        return F.normalize(bases, dim=1)

    def local_step(self, x: Tensor, bases: Tensor, coef: Tensor) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    def compute_coef(self, x: Tensor, bases: Tensor, coef: Tensor) -> Tensor:
        raise NotImplementedError

    @torch.no_grad()
    def local_inference(self, x: Tensor, bases: Tensor) -> tuple[Tensor, Tensor]:
        coef = torch.bmm(x.transpose(1, 2), bases)
        coef = F.softmax(self.inv_t * coef, dim=-1)
        steps = self.steps if self.training else self.eval_steps
        for _ in range(steps):
            bases, coef = self.local_step(x, bases, coef)
        return bases, coef

    def forward(self, x: Tensor) -> Tensor:
        batch, channels, height, width = x.shape
        flat = x.view(batch, channels, height * width)
        bases = self.build_bases(batch, channels, flat)
        bases, coef = self.local_inference(flat, bases)
        coef = self.compute_coef(flat, bases, coef)
        out = torch.bmm(bases, coef.transpose(1, 2))
        return out.view(batch, channels, height, width)


class OfficialNMF(OfficialHam):
    """NMF: multiplicative updates, inv_t = 1, uniform initial bases."""

    inv_t = 1.0
    nonnegative = True

    def local_step(self, x: Tensor, bases: Tensor, coef: Tensor) -> tuple[Tensor, Tensor]:
        coef = self.compute_coef(x, bases, coef)
        numerator = torch.bmm(x, coef)
        denominator = bases.bmm(coef.transpose(1, 2).bmm(coef))
        bases = bases * numerator / (denominator + 1e-6)
        return bases, coef

    def compute_coef(self, x: Tensor, bases: Tensor, coef: Tensor) -> Tensor:
        numerator = torch.bmm(x.transpose(1, 2), bases)
        denominator = coef.bmm(bases.transpose(1, 2).bmm(bases))
        return coef * numerator / (denominator + 1e-6)


class OfficialVQ(OfficialHam):
    """VQ: soft k-means with cosine similarity, inv_t = 100."""

    inv_t = 100.0

    def local_step(self, x: Tensor, bases: Tensor, coef: Tensor) -> tuple[Tensor, Tensor]:
        std_x = F.normalize(x, dim=1)
        std_bases = F.normalize(bases, dim=1, eps=1e-6)
        coef = torch.bmm(std_x.transpose(1, 2), std_bases)
        coef = F.softmax(self.inv_t * coef, dim=-1)
        coef = coef / (1e-6 + coef.sum(dim=1, keepdim=True))
        bases = torch.bmm(x, coef)
        return bases, coef

    def compute_coef(self, x: Tensor, bases: Tensor, coef: Tensor) -> Tensor:
        with torch.no_grad():
            x_norm = x.norm(dim=1, keepdim=True)
        std_x = x / (1e-6 + x_norm)
        std_bases = F.normalize(bases, dim=1, eps=1e-6)
        coef = torch.bmm(std_x.transpose(1, 2), std_bases)
        return F.softmax(self.inv_t * coef, dim=-1)


class OfficialCD(OfficialHam):
    """CD: spherical k-means bases, ridge-regression coefficients, inv_t = 100, beta = 0.1."""

    inv_t = 100.0
    beta = 0.1

    def local_step(self, x: Tensor, bases: Tensor, coef: Tensor) -> tuple[Tensor, Tensor]:
        std_x = F.normalize(x, dim=1)
        coef = torch.bmm(std_x.transpose(1, 2), bases)
        coef = F.softmax(self.inv_t * coef, dim=-1)
        coef = coef / (1e-6 + coef.sum(dim=1, keepdim=True))
        bases = torch.bmm(x, coef)
        bases = F.normalize(bases, dim=1, eps=1e-6)
        return bases, coef

    def compute_coef(self, x: Tensor, bases: Tensor, coef: Tensor) -> Tensor:
        gram = torch.bmm(bases.transpose(1, 2), bases)
        eye = torch.eye(self.rank, device=x.device, dtype=x.dtype)
        inverse = torch.inverse(gram + self.beta * eye)
        return torch.bmm(x.transpose(1, 2), bases).bmm(inverse)


OFFICIAL = {"nmf": OfficialNMF, "vq": OfficialVQ, "cd": OfficialCD}
