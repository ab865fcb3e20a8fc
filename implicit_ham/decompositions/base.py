"""``Decomposition``: a matrix decomposition as an implicit (fixed-point) layer.

A feature map x (B, C, H, W) or a sequence x (B, C, N) is reshaped to X (B*S, d, n) with S
groups by the one flatten rule of ``layout`` (n = H*W or N positions, d = C/S channels; the
roles swapped for the channel ham). The iteration state is the tuple (bases D (B*S, d, r),
coefficients C (B*S, n, r)); X goes in the problem's ``args`` so every backward mode's
gradient reaches the input through them. A subclass supplies the algorithm:

* ``init(x, bases) -> (D0, C0)`` (default ``C0 = softmax_r(inv_t * X^T D0)``), optionally
  ``init_shared(x, bases) -> ((D0, C0), product)`` handing a product of the initialisation to
  the first step (read there with ``shared_product``; NMF's ``X^T D0``),
* ``step(x, state) -> state``: one iteration, the map ``f`` of the fixed-point problem,
* optionally ``loop_invariants(x)`` and ``step_with(x, state, invariants)``: quantities of X
  that every iteration needs, computed once per solve (see ``IterationMap``),
* ``compute_coef(x, state) -> C`` (default: the C of one more ``step``) and
  ``readout(x, state) = D C^T``,
* optionally ``objective(x, state)`` (default ``||X - readout||_F^2`` per sample).

Gradient semantics of ``forward`` (the solve always runs ``steps`` iterations in training and
``eval_steps`` in evaluation, so the value does not depend on the backward mode):

* ``adjoint=OneStep()`` and ``grad_through_bases=False`` (the defaults, the paper's one-step
  gradient; any mode whose ``readout_step_only`` is True): the K iterations run under
  ``torch.no_grad()``; ``compute_coef`` then runs with
  gradient and the output ``D_K C^T`` uses the detached bases D_K, so the gradient reaches X
  only through the final coefficient computation.
* ``adjoint=OneStep()`` and ``grad_through_bases=True``: the last iteration carries gradient
  (bases and coefficients), then the readout with gradient through both.
* any other backward mode (Unroll, Truncated, Phantom, Neumann, Implicit) is handed to
  ``fixed_point`` unchanged, then the readout runs with gradient through bases and coefficients.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any, ClassVar

import torch
from torch import Tensor

from implicit_ham._core.registry import check_options
from implicit_ham._core.state import detached
from implicit_ham._core.validation import check_positive_int
from implicit_ham.adjoints.modes import ADJOINTS, Adjoint, OneStep
from implicit_ham.decompositions import input_checks, layout
from implicit_ham.decompositions.initial_bases import InitialBases
from implicit_ham.decompositions.iteration import IterationMap
from implicit_ham.decompositions.options import DecompositionOptions
from implicit_ham.problems.fixed_point import FixedPointProblem, Solution
from implicit_ham.solvers.base import SOLVERS, FixedPointSolver
from implicit_ham.solvers.iteration import FixedPointIteration

State = tuple[Tensor, Tensor]


class Decomposition(InitialBases, ABC):
    """Base of every decomposition layer: x (B, C, H, W) or a sequence (B, C, N) -> its
    low-rank part, same shape (n = H*W or N positions, see the module docstring).

    Args:
        rank: r, the number of bases.
        groups: S, channel groups decomposed independently (C must be divisible by S).
        steps: iterations K in training mode. eval_steps: iterations in evaluation mode.
        inv_t: softmax inverse temperature; None takes the class default ``default_inv_t``.
        eps: the small constant of the divisions and of the bases' normalisation inside the
            iteration (the official code's 1e-6).
        norm_eps: the floor of the norms that normalise the input's columns (VQ, CD) and the
            initial and online bases; the official code's ``F.normalize`` default, 1e-12.
        spatial: True: d = C/S, n = H*W (or N); False: d = H*W (or N), n = C/S (the channel
            ham).
        init: where the initial bases come from in training mode (and in evaluation mode when
            ``eval_init`` is None): "random" (fresh bases drawn by ``sample_bases`` from torch's
            global RNG on x's device at every forward, L2-normalised over d; the paper's),
            "fixed" (bases drawn once by ``sample_bases`` from a generator seeded with
            ``init_seed``, L2-normalised, shared by the batch and never updated: the buffer
            ``fixed_bases`` (S, d, r), saved in the state dict, when d is known at construction
            (``channels`` given, or handed by a ``Hamburger`` block: ``bind_channels``;
            ``spatial=True``); otherwise drawn again from the same seed at each forward, which
            an export refuses) or "online" (a buffer ``bases`` (S, d, r) shared by the batch,
            updated outside autograd by ``D <- normalize_d(D + eta * (mean_batch(D_K) - D))``,
            see ``online_update``).
        eval_init: the same choice for evaluation mode; None (default) follows ``init``.
            ``"fixed"`` makes evaluation deterministic: two evaluations of one input are
            bitwise equal whatever the global RNG state, and across a save / load.
        init_seed: the seed of the "fixed" bases (the global RNG is left untouched).
        channels: C, optional; required for "online" bases (they fix d = C/S, so they need
            ``spatial=True``) and for the "fixed" buffer, otherwise only used to validate
            divisibility early.
        eta: the online update rate.
        online_update: when the online bases are updated: "eval" (the official code: only in
            evaluation mode), "train" (only in training mode) or "always".
        solver: forward solver (instance or registry name), default ``FixedPointIteration()``;
            its ``max_steps`` is replaced by ``steps`` / ``eval_steps``.
        adjoint: backward mode (instance or registry name), default ``OneStep()``; a plain
            attribute that may be swapped between calls.
        grad_through_bases: only with a mode whose ``readout_step_only`` is True
            (``OneStep``): let the last iteration's bases carry gradient (see the module
            docstring).
        compile: run ``step`` and ``readout`` through ``torch.compile`` (fused elementwise
            work; the first call per shape and grad mode compiles, which takes seconds and
            needs a C++ compiler on the CPU). Values match eager mode up to rounding.

    Where the initial bases come from (``init``, ``eval_init``, ``sample_bases``,
    ``initial_bases``, the "fixed" and "online" buffers) is the base class ``InitialBases``.

    The keywords from ``groups`` to ``online_update`` (all but ``rank``, ``solver``,
    ``adjoint``, ``grad_through_bases`` and ``compile``) arrive as ``**options``, are checked
    as a frozen ``DecompositionOptions`` (the union of ``IterationOptions``, ``LayoutOptions``
    and ``BasesOptions``) and set the attributes the methods read (``steps``, ``groups``,
    ``init_mode``, ...); the property ``options`` gives their current values back as one.

    Class attributes: ``keyword_options`` (the dataclass whose fields are the keywords of
    ``**options``, read by ``parameter_names`` and the config generator), ``default_inv_t``
    (the softmax inverse temperature when ``inv_t`` is None), ``nonnegative`` (the layer needs
    a non-negative input), ``exact_unroll`` (the ``Unroll`` gradient is the exact derivative
    of the output; False when the readout deliberately holds a quantity constant, as VQ's
    ``||X||``: the conformance kit then skips its finite-difference check).

    Attributes:
        last_solution: the ``Solution`` of the latest forward (None before the first, from
            the start of each forward until its solve ends, and after a forward that raised:
            a solve never holds the previous state beside its own): its value detached (so
            the module stays deep-copyable), its stats, and the same ``backward_log`` list the
            backward pass appends to.
    """

    default_inv_t: ClassVar[float] = 1.0
    keyword_options: ClassVar[type] = DecompositionOptions
    nonnegative: ClassVar[bool] = False
    exact_unroll: ClassVar[bool] = True

    def __new__(cls, *args: Any, **kwargs: Any) -> Decomposition:
        """Refuse unknown keyword arguments with the list of valid ones (before ``__init__``,
        whose bare TypeError would not list them)."""
        check_options(cls, kwargs, cls.__name__)
        return super().__new__(cls)

    def __init__(
        self,
        rank: int = 64,
        *,
        solver: FixedPointSolver | str | None = None,
        adjoint: Adjoint | str | None = None,
        grad_through_bases: bool = False,
        compile: bool = False,
        **options: Any,
    ) -> None:
        super().__init__()
        owner = type(self).__name__
        check_positive_int(owner, "rank", rank)
        opts = DecompositionOptions(**options)
        opts.check(owner)
        self.rank = rank
        self.groups, self.spatial, self.channels = opts.groups, bool(opts.spatial), opts.channels
        self.steps, self.eval_steps = opts.steps, opts.eval_steps
        self.inv_t = float(self.default_inv_t if opts.inv_t is None else opts.inv_t)
        self.eps, self.norm_eps = opts.eps, opts.norm_eps
        self.init_mode = opts.init
        self.eval_init_mode = opts.init if opts.eval_init is None else opts.eval_init
        self.init_seed, self.eta, self.online_update = opts.init_seed, opts.eta, opts.online_update
        self.solver = SOLVERS.resolve(
            FixedPointIteration() if solver is None else solver, FixedPointSolver
        )
        self.adjoint = ADJOINTS.resolve(OneStep() if adjoint is None else adjoint, Adjoint)
        self.grad_through_bases = bool(grad_through_bases)
        self.use_compile = bool(compile)
        self._compiled: dict[str, Callable[..., Any]] = {}
        self._shared: tuple[Tensor, Tensor, Tensor] | None = None
        self.last_solution: Solution | None = None
        if opts.channels is not None:
            input_checks.check_groups(owner, opts.channels, self.groups)
        self._register_bases()

    @property
    def options(self) -> DecompositionOptions:
        """The layer's current options as the frozen dataclass: the attributes its methods
        read (which a caller may change between calls, e.g. ``steps``), with ``inv_t``
        resolved to the number in use and ``eval_init`` the evaluation mode's init."""
        return DecompositionOptions(
            steps=self.steps,
            eval_steps=self.eval_steps,
            inv_t=self.inv_t,
            eps=self.eps,
            norm_eps=self.norm_eps,
            groups=self.groups,
            spatial=self.spatial,
            channels=self.channels,
            init=self.init_mode,
            eval_init=self.eval_init_mode,
            init_seed=self.init_seed,
            eta=self.eta,
            online_update=self.online_update,
        )

    # ----------------------------------------------------------------- the plug-in interface
    def init(self, x: Tensor, bases: Tensor) -> State:
        """The initial state from the initial bases D0 (B*S, d, r) that the init policy chose:
        ``(D0, C0)`` with ``C0 = softmax_r(inv_t * X^T D0)`` (B*S, n, r)."""
        return bases, torch.softmax(self.inv_t * (x.transpose(1, 2) @ bases), dim=-1)

    def init_shared(self, x: Tensor, bases: Tensor) -> tuple[State, Tensor | None]:
        """``(init(x, bases), product)``: the initial state and a product the initialisation
        computed that the first step needs again (None by default; NMF: ``X^T D0``). The
        problem's map hands it to the first step at exactly this state (``IterationMap``),
        whose ``shared_product`` returns it instead of recomputing it."""
        bases0, coef0 = self.init(x, bases)
        return (bases0, coef0), None

    @contextmanager
    def sharing(self, bases: Tensor, x: Tensor, product: Tensor) -> Iterator[None]:
        """While the first step runs: ``shared_product(bases, x)`` returns ``product``."""
        self._shared = (bases, x, product)
        try:
            yield
        finally:
            self._shared = None

    def shared_product(self, bases: Tensor, x: Tensor) -> Tensor | None:
        """The product ``init_shared`` handed over for exactly these tensors, or None (then
        the caller computes it). Used once."""
        shared = self._shared
        if shared is None or shared[0] is not bases or shared[1] is not x:
            return None
        self._shared = None
        return shared[2]

    @abstractmethod
    def step(self, x: Tensor, state: State) -> State:
        """One iteration: X (B*S, d, n), (D, C) -> (D', C') with the same shapes."""

    def loop_invariants(self, x: Tensor) -> Any:
        """What every iteration on X (B*S, d, n) needs that does not change during a solve;
        the solve computes it once and hands it to ``step_with``. Default: None."""
        return None

    def step_with(self, x: Tensor, state: State, invariants: Any) -> State:
        """``step`` given ``loop_invariants(x)``; default: ``step(x, state)``. A subclass that
        defines invariants overrides this and lets ``step`` compute them itself."""
        return self.step(x, state)

    def compute_coef(self, x: Tensor, state: State) -> Tensor:
        """The coefficients (B*S, n, r) used by the readout. Default: the coefficient part of
        one more ``step`` (so the readout stays differentiable in X under the paper's one-step
        gradient, whose state carries no gradient); override it when the last coefficients
        are computed otherwise (NMF: one more C update; CD: a ridge solve)."""
        return self.step(x, state)[1]

    def readout(self, x: Tensor, state: State) -> Tensor:
        """The low-rank reconstruction ``D compute_coef(X, state)^T`` (B*S, d, n)."""
        return torch.bmm(state[0], self.compute_coef(x, state).transpose(1, 2))

    def objective(self, x: Tensor, state: State) -> Tensor:
        """(B*S,): the reconstruction error ``||X - readout(X, state)||_F^2`` per sample."""
        return (x - self.readout(x, state)).square().sum(dim=(1, 2))

    def check_input(self, x: Tensor, bases: Tensor) -> None:
        """Raise ValueError if X (B*S, d, n) or the initial bases are outside the algorithm's
        domain. Default: anything finite is accepted (finiteness, and non-negativity for a
        class with ``nonnegative = True``, are checked before, in one pass over X:
        ``check_values``)."""

    def check_values(self, x: Tensor, bases: Tensor) -> None:
        """NonFiniteError if X (B*S, d, n) holds NaN / inf; ValueError if the rank is not below
        min(d, n); for a ``nonnegative`` layer, ValueError if X or the initial bases hold a
        negative value (that order; one pass over X: ``input_checks.check_values``)."""
        input_checks.check_values(
            type(self).__name__,
            x,
            bases,
            rank=self.rank,
            spatial=self.spatial,
            nonnegative=self.nonnegative,
        )

    # ------------------------------------------------------------------------ the layer
    def bind_channels(self, channels: int) -> None:
        """Adopt C = ``channels`` as this layer's input channels (what a block that knows its
        width does: ``Hamburger``). A layer built without ``channels`` validates it against
        ``groups`` and, with "fixed" bases and ``spatial=True``, registers the ``fixed_bases``
        buffer (S, C/S, r) once, instead of drawing the seeded bases at every forward (the
        same values; exportable). A layer built with other channels raises ValueError."""
        layout.check_bound_channels(
            type(self).__name__, channels, built_for=self.channels, groups=self.groups
        )
        self.channels = channels
        self._register_fixed_bases()

    def flatten(self, x: Tensor) -> Tensor:
        """(B, C, H, W) or (B, C, N) -> X (B*S, d, n) in this layer's layout, n = H*W or N
        (``layout.flatten``)."""
        return layout.flatten(
            type(self).__name__, x, groups=self.groups, spatial=self.spatial, channels=self.channels
        )

    def unflatten(self, y: Tensor, shape: torch.Size | tuple[int, ...]) -> Tensor:
        """Inverse of ``flatten``: (B*S, d, n) -> ``shape`` (B, C, H, W) or (B, C, N)."""
        return layout.unflatten(y, shape, spatial=self.spatial)

    def active_solver(self) -> FixedPointSolver:
        """The forward solver with ``max_steps`` = ``steps`` (training) or ``eval_steps``."""
        solver = SOLVERS.resolve(self.solver, FixedPointSolver)
        return dataclasses.replace(  # type: ignore[type-var]
            solver, max_steps=self.steps if self.training else self.eval_steps
        )

    def active_adjoint(self) -> Adjoint:
        """The current backward mode (``adjoint`` resolved from a name if needed)."""
        return ADJOINTS.resolve(self.adjoint, Adjoint)

    def implicit_problem(self, x: Tensor, init: Tensor | None = None) -> FixedPointProblem:
        """The fixed-point problem ``forward`` solves for x (B, C, H, W) or (B, C, N):
        ``f(state, X)`` is one ``step`` (an ``IterationMap``, which computes the loop
        invariants once per solve),
        ``z0 = init(X, D0)``, ``args = (X,)`` with X (B*S, d, n). With random init, each call
        draws new bases; pass ``init`` for a reproducible problem."""
        flat = self.flatten(x)
        bases = self.initial_bases(flat, init)
        self.check_values(flat, bases)  # NaN / inf first, then the rank, then the sign
        self.check_input(flat, bases)
        z0, product = self.init_shared(flat, bases)
        step = IterationMap(self)
        step.share(z0[0], flat, product)
        return FixedPointProblem(step, z0, (flat,))

    def iterate(self, state: State, x: Tensor) -> State:
        """``f(z, *args)`` in ``fixed_point``'s argument order: ``step(x, state)`` (without the
        per-solve memo of ``implicit_problem``'s map)."""
        return tuple(self.kernel("step")(x, state))

    def forward(self, x: Tensor, init: Tensor | None = None) -> Tensor:
        """x (B, C, H, W) -> its low-rank reconstruction (B, C, H, W); a sequence (B, C, N)
        -> (B, C, N), the same values as for the map (B, C, N, 1).

        Args:
            x: the feature map or sequence.
            init: optional explicit initial bases (B*S, d, r), e.g. for reproducible runs.

        Raises:
            TypeError: ``x`` is not a floating-point tensor (the solve needs real arithmetic).
        """
        input_checks.check_floating(type(self).__name__, x)
        self.last_solution = None  # the previous forward's state is released before this solve
        adjoint = self.active_adjoint()
        if adjoint.readout_step_only and not self.grad_through_bases:
            with torch.no_grad():  # z0 = init(X, D0) too: no graph the gradient never uses
                solution = self.implicit_problem(x, init).solve(self.active_solver(), adjoint)
            # detached: no_grad does not stop forward-mode tangents (torch.func.jvp / jacfwd)
            solution.value = detached(tuple(solution.value))
            flat = self.flatten(x)
        else:
            problem = self.implicit_problem(x, init)
            solution = problem.solve(self.active_solver(), adjoint)
            flat = problem.args[0]
            del problem  # z0 is not needed past the solve: its memory goes before the readout
        self.last_solution = Solution(
            tuple(t.detach() for t in solution.value), solution.stats, solution.backward_log
        )
        if self._updates_online_bases():
            self._update_online_bases(solution.value[0])
        readout = self.kernel("readout")(flat, solution.value)
        return layout.match_memory_format(self.unflatten(readout, x.shape), x)

    def extra_repr(self) -> str:
        parts = [
            f"rank={self.rank}",
            f"groups={self.groups}",
            f"steps={self.steps}",
            f"eval_steps={self.eval_steps}",
            f"inv_t={self.inv_t:g}",
            f"spatial={self.spatial}",
            f"init={self.init_mode!r}",
        ]
        if self.eval_init_mode != self.init_mode:
            parts.append(f"eval_init={self.eval_init_mode!r}")
        parts += [
            f"adjoint={self.adjoint!r}",
        ]
        solver = SOLVERS.resolve(self.solver, FixedPointSolver)
        if solver != FixedPointIteration(max_steps=solver.max_steps):
            parts.append(f"solver={solver!r}")
        if self.grad_through_bases:
            parts.append("grad_through_bases=True")
        if self.use_compile:
            parts.append("compile=True")
        return ", ".join(parts)

    def kernel(self, name: str) -> Callable[..., Any]:
        """The method ``name`` ("step", "step_with", "readout") bound to this layer: eager, or
        with ``compile=True`` the class's function through ``torch.compile`` (built once per
        layer; compiling the unbound function keeps a deep copy correct)."""
        if not self.use_compile:
            return getattr(self, name)
        compiled = self._compiled.get(name)
        if compiled is None:
            compiled = torch.compile(getattr(type(self), name))
            self._compiled[name] = compiled
        return partial(compiled, self)

    def __getstate__(self) -> dict[str, Any]:
        """Pickle / deep-copy state without the compiled functions (rebuilt on demand)."""
        state = self.__dict__.copy()
        state["_compiled"] = {}
        state["_shared"] = None
        return state
