"""The options of a ``Decomposition``, grouped and checked once.

A layer takes them as flat keywords (``NMF(rank=64, steps=6, groups=2, init="fixed")``, what
users and the generated experiment configs pass); ``Decomposition.__init__`` routes them into
``DecompositionOptions`` and checks them under the layer's name. ``DecompositionOptions`` is
the flat union of the three groups, so its constructor's signature is the keyword API (the
layer class's ``keyword_options``, which ``parameter_names`` and the config generator read).
"""

from __future__ import annotations

from dataclasses import dataclass

from implicit_ham._core.validation import (
    check_choice,
    check_positive_int,
    check_tolerance,
    check_unit_interval,
)
from implicit_ham.decompositions.initial_bases import INIT_MODES, ONLINE_UPDATES


@dataclass(frozen=True)
class LayoutOptions:
    """How x is reshaped to X (B*S, d, n).

    Attributes:
        groups: S, channel groups decomposed independently (C must be divisible by S).
        spatial: True: d = C/S, n = H*W (or N); False: d = H*W (or N), n = C/S.
        channels: C, optional (see ``Decomposition``).
    """

    groups: int = 1
    spatial: bool = True
    channels: int | None = None


@dataclass(frozen=True)
class IterationOptions:
    """The iteration's budget and constants.

    Attributes:
        steps: iterations K in training mode. eval_steps: iterations in evaluation mode.
        inv_t: softmax inverse temperature; None takes the class default ``default_inv_t``.
        eps: the small constant of the divisions and of the bases' normalisation.
        norm_eps: the floor of the norms that normalise the input's columns and the bases.
    """

    steps: int = 6
    eval_steps: int = 7
    inv_t: float | None = None
    eps: float = 1e-6
    norm_eps: float = 1e-12

    def check_iteration(self, owner: str) -> None:
        """ValueError naming ``owner`` and the field when an option is out of range."""
        check_positive_int(owner, "steps", self.steps)
        check_positive_int(owner, "eval_steps", self.eval_steps)
        check_tolerance(owner, "eps", self.eps)
        check_tolerance(owner, "norm_eps", self.norm_eps)
        check_tolerance(owner, "inv_t", self.inv_t, optional=True)


@dataclass(frozen=True)
class BasesOptions:
    """Where the initial bases come from (see ``InitialBases``).

    Attributes:
        init: "random", "fixed" or "online" in training mode.
        eval_init: the same for evaluation mode; None follows ``init``.
        init_seed: the seed of the "fixed" bases.
        eta: the online update rate, in (0, 1].
        online_update: when the online bases are updated: "eval", "train" or "always".
    """

    init: str = "random"
    eval_init: str | None = None
    init_seed: int = 0
    eta: float = 0.9
    online_update: str = "eval"

    def check_bases(self, owner: str) -> None:
        """ValueError naming ``owner`` and the field when an option is out of range."""
        check_choice(owner, "init", self.init, INIT_MODES)
        if self.eval_init is not None:
            check_choice(owner, "eval_init", self.eval_init, INIT_MODES)
        check_positive_int(owner, "init_seed", self.init_seed, minimum=0)
        check_choice(owner, "online_update", self.online_update, ONLINE_UPDATES)
        check_unit_interval(owner, "eta", self.eta)


@dataclass(frozen=True)
class DecompositionOptions(BasesOptions, LayoutOptions, IterationOptions):
    """All the flat keywords of a decomposition layer: the union of ``IterationOptions``,
    ``LayoutOptions`` and ``BasesOptions`` (each field documented there)."""

    def check(self, owner: str) -> None:
        """ValueError naming ``owner`` (the layer) and the first field out of range (groups,
        the iteration's, the bases', then channels)."""
        check_positive_int(owner, "groups", self.groups)
        self.check_iteration(owner)
        self.check_bases(owner)
        if self.channels is not None:
            check_positive_int(owner, "channels", self.channels)
