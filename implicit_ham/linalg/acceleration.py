"""Native Anderson acceleration and Broyden's method on batched flat states (B, N).

The same algorithms as torchdeq's ``anderson_solver`` and ``broyden_solver`` (no line search),
written for this library's solver contract:

* the returned point is an iterate at which ``f`` was evaluated, so its residual
  ``||f(x) - x||`` is known exactly and no evaluation is spent to measure it (torchdeq's
  Anderson returns ``f(x_k)``, whose residual is unknown without one more evaluation);
* per sample, the iterate with the lowest residual (in the stopping metric) is returned;
* the residual history of Anderson lives in preallocated buffers and its Gram matrix is
  updated by one row per step (O(m N) instead of O(m^2 N)); the mixing system is solved with
  ``torch.linalg.solve_ex`` (no exception, no host synchronisation; a singular system shows up
  as a non-finite iterate);
* one host synchronisation per evaluation when there is a tolerance (the stopping decision,
  which also detects NaN / inf), none per evaluation without one (one at the end);
* per-sample stopping: with a tolerance, a sample that has converged is frozen (its returned
  iterate and residual stay those of its stop) while the others go on; the mixing is per
  sample, so a sample's value and step count do not depend on its batch-mates (torchdeq's
  solvers stop the whole batch on the worst sample and keep updating converged samples'
  iterates, only their best-so-far choice keeps them from getting worse);
* ``whole_batch=True`` (for an ``f`` that couples the samples): no sample is frozen, and the
  returned iterate is the evaluated batch with the lowest worst-sample residual, so it is a
  batch ``f`` was evaluated at as a whole and its residuals are those of that evaluation.
  ``Iterate.image`` says whether the per-sample result is such a batch.

``Iterate`` is the shared result; ``anderson`` and ``broyden`` are plain functions of
``f: (B, N) -> (B, N)``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from implicit_ham._core.precision import working_dtype

FlatMap = Callable[[Tensor], Tensor]


@dataclass
class Iterate:
    """Result of a native accelerated solve.

    Attributes:
        x: (B, N) per sample the evaluated iterate with the lowest residual.
        abs_residual, rel_residual: (B,) ``||f(x) - x||`` and that over ``||f(x)||`` at ``x``.
        residuals, rel_residuals: (evaluations, B) the residual of every evaluated iterate;
            a sample frozen at its stop repeats its residual there in the later rows.
        failed_at: None, or the index (0-based) of the first evaluation whose residual was
            NaN / inf (then ``x`` must not be trusted).
        sample_steps: (B,) int64 evaluations each sample took before it converged and was
            frozen (per-sample stopping); None when no sample stopped before the others.
        image: (B, N) ``f(x)`` when ``x`` is a batch ``f`` was evaluated at as a whole (the
            latest evaluation: every sample's best is there, frozen ones held at their stop),
            so that the residuals of that evaluation are those of ``x`` whatever ``f`` does
            across samples; None when ``x`` assembles samples from different evaluations.
    """

    x: Tensor
    abs_residual: Tensor
    rel_residual: Tensor
    residuals: Tensor
    rel_residuals: Tensor
    failed_at: int | None
    sample_steps: Tensor | None = None
    image: Tensor | None = None

    @property
    def evaluations(self) -> int:
        """Evaluations of ``f`` spent."""
        return self.residuals.shape[0]


class _Tracker:
    """Per-sample best iterate, per-sample stopping and the residual trace, kept on the device.

    With a tolerance, a sample whose residual is ``<= tol`` is frozen: its best iterate and
    residual no longer change (``hold`` keeps its iterate), and it no longer counts in the
    stopping decision or the NaN / inf check, so its value and step count are those of solving
    it alone. One host synchronisation per evaluation (two numbers while no sample is frozen:
    the smallest and largest residual; then the largest over the running samples).
    ``whole_batch``: the batch is one problem: no sample is frozen, and an evaluation is the
    new best of every sample or of none (by its worst-sample residual)."""

    def __init__(
        self,
        x0: Tensor,
        tol: float | None,
        stop_mode: str,
        keep_image: bool = False,
        whole_batch: bool = False,
    ) -> None:
        self.tol, self.use_rel, self.whole_batch = tol, stop_mode == "rel", whole_batch
        self.best_worst = x0.new_full((), float("inf"))  # whole_batch: the best's worst sample
        self.latest: tuple[Tensor, Tensor] | None = None  # the latest evaluation's (x, f(x))
        self.best = self.initial = x0
        self.best_image: Tensor | None = x0 if keep_image else None  # f(best)
        self.extra: tuple[Tensor, Tensor] | None = None  # the polish evaluation's residuals
        batch = x0.shape[0]
        self.best_abs = x0.new_full((batch,), float("inf"))
        self.best_rel = x0.new_full((batch,), float("inf"))
        self.abs: list[Tensor] = []
        self.rel: list[Tensor] = []
        self.finite = torch.ones((), dtype=torch.bool, device=x0.device)
        self.failed_at: int | None = None
        self.active: Tensor | None = None  # None while no sample is frozen
        self.stops: Tensor | None = None

    def add(self, x: Tensor, fx: Tensor, gx: Tensor) -> bool:
        """Record the evaluation ``fx = f(x)`` with residual ``gx = fx - x``; True to stop."""
        abs_res = torch.linalg.vector_norm(gx, dim=1)
        size = torch.linalg.vector_norm(fx, dim=1).clamp_min(torch.finfo(x.dtype).tiny)
        rel_res = abs_res / size
        self.abs.append(abs_res)
        self.rel.append(rel_res)
        metric = rel_res if self.use_rel else abs_res
        self.latest = (x, fx)
        if self.whole_batch:
            worst = metric.amax()
            better = (worst < self.best_worst).expand(metric.shape)
            self.best_worst = torch.minimum(worst, self.best_worst)
        else:
            better = metric < (self.best_rel if self.use_rel else self.best_abs)
        if self.active is not None:
            better = better & self.active
        if self.tol is None:
            self._keep(better, False, x, fx, abs_res, rel_res)
            self.finite = self.finite & torch.isfinite(metric).all()
            return False
        stop, every = self._decide(metric, float(self.tol), better)
        self._keep(better, every, x, fx, abs_res, rel_res)
        return stop

    def _keep(
        self, better: Tensor, every: bool, x: Tensor, fx: Tensor, abs_res: Tensor, rel_res: Tensor
    ) -> None:
        """Make the evaluation the best one of the samples it improved (``every``: all of
        them, known on the host: kept by reference, without a pass over the states)."""
        if every and x is not self.initial:  # the caller's x0 is never returned by reference
            self.best, self.best_abs, self.best_rel = x, abs_res, rel_res
            if self.best_image is not None:
                self.best_image = fx
            return
        self.best = torch.where(better[:, None], x, self.best)
        if self.best_image is not None:
            self.best_image = torch.where(better[:, None], fx, self.best_image)
        self.best_abs = torch.where(better, abs_res, self.best_abs)
        self.best_rel = torch.where(better, rel_res, self.best_rel)

    def _decide(self, metric: Tensor, tol: float, better: Tensor) -> tuple[bool, bool]:
        """The evaluation's one host synchronisation: (stop, every sample improved). While no
        sample is frozen it reads the smallest and largest residual and whether every sample
        improved on its best (then the caller keeps the evaluation without a ``where``)."""
        count = len(self.abs)
        every = False
        if self.active is None:
            bounds = torch.aminmax(metric)
            low, high, improved = torch.stack(
                (bounds.min, bounds.max, better.all().to(metric.dtype))
            ).tolist()
            every = improved == 1.0
            done = metric <= tol if low <= tol < high and not self.whole_batch else None
        else:
            high = metric.masked_fill(~self.active, 0.0).max().item()
            done = self.active & (metric <= tol)
        if high != high or high == float("inf"):
            self.failed_at = count - 1
            return True, False
        if high <= tol:
            return True, every
        if done is not None:
            if self.stops is None:
                self.stops = torch.zeros(metric.shape, dtype=torch.int64, device=metric.device)
            self.stops = self.stops.masked_fill(done, count)
            self.active = ~done if self.active is None else self.active & ~done
        return False, every

    def polish(self, f: FlatMap) -> None:
        """One more evaluation, at ``f(best)``: per sample, ``f(best)`` replaces ``best`` when
        its measured residual (the stopping metric) is lower. Frozen samples take part like
        the others (their ``best`` is the one of their stop), so the choice is per sample."""
        assert self.best_image is not None
        y = self.best_image
        fy = f(y)
        abs_res = torch.linalg.vector_norm(fy - y, dim=1)
        size = torch.linalg.vector_norm(fy, dim=1).clamp_min(torch.finfo(y.dtype).tiny)
        rel_res = abs_res / size
        metric = rel_res if self.use_rel else abs_res
        if self.whole_batch:
            better = (metric.amax() < self.best_worst).expand(metric.shape)
        else:
            better = metric < (self.best_rel if self.use_rel else self.best_abs)
        if bool(better.all()):
            self.latest = (y, fy)
        elif bool(better.any()):
            self.latest = None  # best now mixes x_best and y: no batch was evaluated as it is
        self.best = torch.where(better[:, None], y, self.best)
        self.best_abs = torch.where(better, abs_res, self.best_abs)
        self.best_rel = torch.where(better, rel_res, self.best_rel)
        self.extra = (torch.minimum(abs_res, self.best_abs), torch.minimum(rel_res, self.best_rel))

    def hold(self, x_next: Tensor, x: Tensor) -> Tensor:
        """The next iterate: ``x_next``, but ``x`` for the frozen samples."""
        return x_next if self.active is None else torch.where(self.active[:, None], x_next, x)

    def result(self) -> Iterate:
        image = self._image()
        if self.tol is None and self.failed_at is None and not image.finite:
            image.fx = None
            rows = torch.stack(self.abs)
            bad = ~torch.isfinite(rows).all(dim=1)
            self.failed_at = int(bad.nonzero()[0, 0])
        residuals, rel = torch.stack(self.abs), torch.stack(self.rel)
        steps = None
        if self.stops is not None and self.active is not None:
            steps = torch.where(self.active, torch.full_like(self.stops, len(self.abs)), self.stops)
            index = torch.minimum(
                torch.arange(len(residuals), device=steps.device)[:, None], steps[None] - 1
            )
            residuals, rel = residuals.gather(0, index), rel.gather(0, index)
        if self.extra is not None:  # the polish evaluation: one more row, one more step
            residuals = torch.cat([residuals, self.extra[0][None]])
            rel = torch.cat([rel, self.extra[1][None]])
            steps = None if steps is None else steps + 1
        return Iterate(
            self.best,
            self.best_abs,
            self.best_rel,
            residuals,
            rel,
            self.failed_at,
            steps,
            image.fx,
        )

    def _image(self) -> _Image:
        """``f(best)`` when ``best`` is the latest evaluated batch, and (without a tolerance)
        whether every evaluation was finite, read together: one host synchronisation at most
        (none with a tolerance when ``best`` is that batch by reference)."""
        flags = []
        if self.tol is None and self.failed_at is None:
            flags.append(self.finite)
        latest = None if self.failed_at is not None else self.latest
        if latest is not None and self.best is not latest[0]:
            flags.append((self.best == latest[0]).all())
        values = torch.stack(flags).tolist() if flags else []
        finite = bool(values[0]) if self.tol is None and self.failed_at is None else True
        same = latest is not None and (self.best is latest[0] or bool(values[-1]))
        return _Image(latest[1] if same and latest is not None else None, finite)


@dataclass
class _Image:
    """``_Tracker._image``'s answer: ``f(best)`` (or None) and whether the solve stayed finite."""

    fx: Tensor | None
    finite: bool


def anderson(
    f: FlatMap,
    x0: Tensor,
    *,
    max_evals: int,
    tol: float | None,
    stop_mode: str = "rel",
    m: int = 5,
    lam: float = 1e-4,
    damping: float = 1.0,
    polish: bool = False,
    whole_batch: bool = False,
    relative_lam: bool = False,
    restart: float | None = None,
) -> Iterate:
    """Anderson acceleration of ``x <- f(x)`` for x (B, N), at most ``max_evals`` evaluations.

    Step k evaluates ``f`` at x_k; with ``n = min(k + 1, m)`` stored residuals ``G = F - X``,
    the weights alpha (summing to 1) minimise ``||alpha G||^2 + lam ||alpha||^2`` and
    ``x_{k+1} = damping * alpha F + (1 - damping) * alpha X`` (``x_1 = f(x_0)``), as in
    torchdeq. Stops once the worst sample's residual (``stop_mode``) is ``<= tol``.

    With ``polish`` the last evaluation (of the ``max_evals``) goes to ``f(x_best)`` (torchdeq
    returns that point, unmeasured): per sample the one of ``x_best`` and ``f(x_best)`` with the
    lower measured residual is returned, so the returned residual stays exact.
    ``whole_batch``: the batch is one problem (no per-sample freezing; the returned iterate is
    the evaluated batch with the lowest worst-sample residual), for an ``f`` that couples the
    samples. ``relative_lam``: ``lam`` is relative to the mean squared residual of the stored
    history (scale-free) instead of absolute (torchdeq's). ``restart``: a sample whose newest
    residual exceeds ``restart`` times the smallest of its history drops that history (its
    next step is a plain one); None never restarts (torchdeq's). The defaults are torchdeq's
    (the backward ``AndersonSolve`` uses them); the forward ``Anderson`` sets both.
    """
    batch, size = x0.shape
    xs = x0.new_empty(batch, m, size) if damping != 1.0 else None  # only damping mixes X
    fs = x0.new_empty(batch, m, size)
    gs = x0.new_empty(batch, m, size)
    small = working_dtype(x0.dtype)  # the m x m mixing system in float32 for half states
    gram = x0.new_zeros(batch, m, m, dtype=small)
    system = x0.new_zeros(batch, m + 1, m + 1, dtype=small)
    system[:, 0, 1:] = 1
    system[:, 1:, 0] = 1
    rhs = x0.new_zeros(batch, m + 1, 1, dtype=small)
    rhs[:, 0] = 1
    ridge = lam * torch.eye(m, dtype=small, device=x0.device)
    valid = x0.new_ones(batch, m, dtype=small)  # per sample: the stored residuals in use
    tracker = _Tracker(x0, tol, stop_mode, keep_image=polish, whole_batch=whole_batch)
    loop_evals = max_evals - 1 if polish else max_evals
    x = x0
    for k in range(loop_evals):
        fx = f(x)
        slot = k % m
        if xs is not None:
            xs[:, slot] = x
        fs[:, slot] = fx
        gx = torch.sub(fx, x, out=gs[:, slot])
        if tracker.add(x, fx, gx) or k == loop_evals - 1:
            break
        n = min(k + 1, m)
        if n == 1:
            x = tracker.hold(fx, x)
            gram[:, 0, 0] = torch.linalg.vector_norm(gx, dim=1).square().to(small)
            continue
        # (B, n): <g_i, g_new>, as a (1, N) x (N, n) product per sample (the (n, N) x (N, 1)
        # form runs several times slower in batched BLAS)
        row = torch.bmm(gx[:, None], gs[:, :n].mT)[:, 0].to(small)
        gram[:, slot, :n] = row
        gram[:, :n, slot] = row
        if relative_lam or restart is not None:
            _mixing_system(system, gram, valid, slot, n, lam, relative_lam, restart)
        else:  # torchdeq's system: every stored residual, an absolute lam
            system[:, 1 : n + 1, 1 : n + 1] = gram[:, :n, :n] + ridge[:n, :n]
        solution, _ = torch.linalg.solve_ex(system[:, : n + 1, : n + 1], rhs[:, : n + 1])
        alpha = solution[:, 1 : n + 1, 0][:, None].to(x0.dtype)  # (B, 1, n)
        x_next = torch.bmm(alpha, fs[:, :n])[:, 0]
        if xs is not None:
            x_next = damping * x_next + (1 - damping) * torch.bmm(alpha, xs[:, :n])[:, 0]
        x = tracker.hold(x_next, x)
    if polish and tracker.failed_at is None:
        tracker.polish(f)
    return tracker.result()


def _mixing_system(
    system: Tensor,
    gram: Tensor,
    valid: Tensor,
    slot: int,
    n: int,
    lam: float,
    relative_lam: bool,
    restart: float | None,
) -> None:
    """Fill ``system[:, :n + 1, :n + 1]`` (B, n + 1, n + 1), the bordered mixing system over the
    ``n`` stored residuals, with a relative ``lam`` and / or restarts.

    ``valid`` (B, m), 1.0 where a stored residual belongs to the sample's current history:
    with ``restart``, a sample whose newest residual (``slot``) exceeds ``restart`` times the
    smallest one of its history drops that history (only ``slot`` stays valid, so the next
    iterate is the plain step ``f(x)``). A dropped entry's row and column are those of the
    identity with a zero in the constraint, so its weight is exactly 0. ``relative_lam``: the
    Gram block is divided by the mean squared residual of the valid entries (1 where that is
    0: an exact fixed point), which minimises ``||alpha G||^2 + lam * mean ||g||^2 ||alpha||^2``
    with a system whose entries are of order one."""
    diag = gram[:, :n, :n].diagonal(dim1=1, dim2=2)  # (B, n) squared residual norms
    if restart is not None:
        others = torch.where(valid[:, :n] > 0, diag, torch.inf)
        others[:, slot] = torch.inf
        again = diag[:, slot] > restart**2 * others.amin(dim=1)
        valid[:, :n] = torch.where(again[:, None], 0.0, valid[:, :n])
    valid[:, slot] = 1.0
    v = valid[:, :n]
    block = gram[:, :n, :n] * v[:, :, None] * v[:, None, :]
    if relative_lam:
        mean_square = (diag * v).sum(dim=1) / v.sum(dim=1)
        block = block / torch.where(mean_square > 0, mean_square, 1.0)[:, None, None]
    system[:, 1 : n + 1, 1 : n + 1] = block + torch.diag_embed(1 - v + lam * v)
    system[:, 0, 1 : n + 1] = v
    system[:, 1 : n + 1, 0] = v


def broyden(
    f: FlatMap,
    x0: Tensor,
    *,
    max_evals: int,
    tol: float | None,
    stop_mode: str = "rel",
    whole_batch: bool = False,
) -> Iterate:
    """Broyden's ("good") method on ``g(x) = f(x) - x`` for x (B, N), without line search, at
    most ``max_evals`` evaluations of ``f``: the inverse Jacobian estimate ``-I + U V^T`` is
    built from rank-one updates u_i, v_i, kept as rows of two preallocated (B, L, N) buffers
    (only the filled rows are read, so they are not zeroed; each product reads contiguous
    rows). Stops once the worst sample's residual (``stop_mode``) is ``<= tol``; ``whole_batch``
    as in ``anderson``."""
    batch, size = x0.shape
    limit = max(max_evals - 1, 1)
    us = x0.new_empty(batch, limit, size)
    vts = x0.new_empty(batch, limit, size)
    tracker = _Tracker(x0, tol, stop_mode, whole_batch=whole_batch)
    x = x0
    fx = f(x)
    gx = fx - x
    if tracker.add(x, fx, gx) or max_evals == 1:
        return tracker.result()
    update = gx
    for step in range(1, max_evals):
        x_new = tracker.hold(x + update, x)
        fx = f(x_new)
        gx_new = fx - x_new
        if tracker.add(x_new, fx, gx_new) or step == max_evals - 1:
            break
        delta_x, delta_g = update, gx_new - gx
        x, gx = x_new, gx_new
        us_k, vts_k = us[:, : step - 1], vts[:, : step - 1]
        vt = _rmatvec(us_k, vts_k, delta_x)
        denom = torch.linalg.vecdot(vt, delta_g)[:, None]
        # a sample that has converged (delta_g ~ 0) gets no update rather than an inf / NaN one
        usable = denom.abs() > torch.finfo(denom.dtype).tiny
        u = (delta_x - _matvec(us_k, vts_k, delta_g)) / torch.where(usable, denom, 1.0)
        vts[:, step - 1] = vt.masked_fill_(~usable | vt.isnan(), 0)
        us[:, step - 1] = u.masked_fill_(~usable | u.isnan(), 0)
        update = -_matvec(us[:, :step], vts[:, :step], gx)
    return tracker.result()


def _matvec(us: Tensor, vts: Tensor, x: Tensor) -> Tensor:
    """``(-I + U V^T) x`` for x (B, N), with the rows of us / vts (B, k, N) the u_i / v_i."""
    if us.shape[1] == 0:
        return -x
    coeffs = torch.bmm(x[:, None], vts.mT)  # (B, 1, k): v_i . x (row form: see ``anderson``)
    return torch.baddbmm(x[:, None], coeffs, us, alpha=1, beta=-1)[:, 0]


def _rmatvec(us: Tensor, vts: Tensor, x: Tensor) -> Tensor:
    """``x^T (-I + U V^T)`` for x (B, N)."""
    if us.shape[1] == 0:
        return -x
    coeffs = torch.bmm(x[:, None], us.mT)  # (B, 1, k): u_i . x
    return torch.baddbmm(x[:, None], coeffs, vts, alpha=1, beta=-1)[:, 0]
