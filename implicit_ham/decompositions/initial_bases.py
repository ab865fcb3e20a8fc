"""``InitialBases``: where a decomposition's initial bases D0 come from.

Three policies, chosen per mode (``init`` in training, ``eval_init`` in evaluation):
"random" (fresh bases at every forward from torch's global RNG, the paper's), "fixed" (bases
drawn once from a generator seeded with ``init_seed``: deterministic evaluation, kept in the
state dict) and "online" (a buffer shared by the batch, moved towards the batch mean of the
solved bases after each forward, outside autograd). ``Decomposition`` inherits this; its
constructor documents the options.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from implicit_ham._core.errors import ExportError
from implicit_ham._core.transforms import exporting

INIT_MODES = ("random", "online", "fixed")
ONLINE_UPDATES = ("eval", "train", "always")


class InitialBases(nn.Module):
    """The initial-bases policy of a decomposition layer (a base of ``Decomposition``, whose
    ``__init__`` sets the attributes below and calls ``_register_bases``).

    Attributes:
        rank, groups, channels, spatial, norm_eps, init_seed, eta, online_update: as in
            ``Decomposition``. init_mode / eval_init_mode: the policy in training /
            evaluation mode.
        bases: the "online" buffer (S, d, r), registered when a mode is "online".
        fixed_bases: the "fixed" buffer (S, d, r), registered when d is known at construction.
    """

    rank: int
    groups: int
    channels: int | None
    spatial: bool
    norm_eps: float
    init_seed: int
    eta: float
    online_update: str
    init_mode: str
    eval_init_mode: str
    bases: Tensor
    fixed_bases: Tensor

    def sample_bases(self, shape: tuple[int, ...], like: Tensor) -> Tensor:
        """Random initial bases of ``shape`` (..., d, r) before normalisation: standard normal,
        on ``like``'s device and dtype. Override for another distribution (NMF: uniform)."""
        return torch.randn(shape, device=like.device, dtype=like.dtype)

    def initial_bases(self, x: Tensor, init: Tensor | None = None) -> Tensor:
        """D0 (B*S, d, r) for X (B*S, d, n): ``init`` if given, else per the init policy."""
        count, d, _ = x.shape
        shape = (count, d, self.rank)
        if init is not None:
            if not isinstance(init, Tensor) or tuple(init.shape) != shape:
                got = tuple(init.shape) if isinstance(init, Tensor) else type(init).__name__
                raise ValueError(
                    f"{type(self).__name__}: explicit init bases must have shape (B*S, d, r) = "
                    f"{shape} for this input, got {got}; pass bases shaped like that."
                )
            return init.to(device=x.device, dtype=x.dtype)
        mode = self.active_init()
        if exporting():
            self._check_exportable(mode)
        if mode == "fixed":
            fixed = self._fixed_bases(d).to(device=x.device, dtype=x.dtype)
            return fixed.repeat(count // self.groups, 1, 1)
        if mode == "online":
            if self.bases.shape[1] != d:
                raise ValueError(
                    f"{type(self).__name__}: the online bases have d={self.bases.shape[1]}, "
                    f"the input gives d={d}; feed inputs with the channels it was built for."
                )
            return self.bases.to(x.dtype).repeat(count // self.groups, 1, 1)
        return F.normalize(self.sample_bases(shape, like=x), dim=1, eps=self.norm_eps)

    def active_init(self) -> str:
        """The init policy of the current mode: ``init`` in training, ``eval_init`` in
        evaluation."""
        return self.init_mode if self.training else self.eval_init_mode

    def _register_bases(self) -> None:
        """Register the buffers the policies need: the online bases, and the fixed ones when d
        is known (``channels`` given, ``spatial=True``)."""
        modes = (self.init_mode, self.eval_init_mode)
        if "online" in modes:
            self._register_online_bases()
        self._register_fixed_bases()

    def _register_fixed_bases(self) -> None:
        """The "fixed" buffer (S, d, r), drawn once from ``init_seed``, when a mode is "fixed"
        and d = C/S is known (``channels`` set, ``spatial=True``) and it is not there yet."""
        fixed = "fixed" in (self.init_mode, self.eval_init_mode)
        if fixed and self.channels is not None and self.spatial and not self._has_fixed_buffer():
            self.register_buffer("fixed_bases", self._seeded_bases(self.channels // self.groups))

    def _has_fixed_buffer(self) -> bool:
        return "fixed_bases" in self._buffers

    def _check_exportable(self, mode: str) -> None:
        """ExportError unless the initial bases of ``mode`` are a buffer the exported graph
        holds as a constant: "fixed" with its buffer. "random" bases would export as a
        random-number node (draws that are not PyTorch's), "online" ones as a constant whose
        in-place update the graph drops, and "fixed" ones without a buffer (d unknown at
        construction) as a seeded draw the exporter records as a random-number node."""
        name = type(self).__name__
        if mode == "fixed" and self._has_fixed_buffer():
            return
        if mode == "fixed":
            why = (
                "its 'fixed' bases are drawn from init_seed at each forward (d is not known at "
                "construction: channels not given"
                + ("" if self.spatial else ", and d = H*W for spatial=False")
                + "), which the exporter records as a random-number node"
            )
            fix = (
                "build it with channels=C (a Hamburger block passes its width), or pass "
                "explicit bases: ham(x, init=bases)"
                if self.spatial
                else "a channel ham (spatial=False) cannot hold them as a buffer; export a "
                "block without channel_ham, or pass explicit bases: ham(x, init=bases)"
            )
        elif mode == "online":
            why = (
                "its 'online' bases are updated in place after each forward, state that an "
                "exported graph does not keep"
            )
            fix = "use eval_init='fixed' with channels=C"
        else:
            why = (
                "its 'random' bases would export as a random-number node whose draws are not "
                "PyTorch's, so the exported outputs would differ from the layer's"
            )
            fix = "use eval_init='fixed' (with channels=C, or inside a Hamburger block)"
        where = "training" if self.training else "evaluation"
        raise ExportError(f"{name} cannot be exported faithfully in {where} mode: {why}; {fix}.")

    def _load_from_state_dict(
        self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any
    ) -> None:
        """A state dict without ``fixed_bases`` (a checkpoint written before the layer had them,
        or by a random-init model, e.g. a converted mmseg one) keeps this layer's seeded bases
        instead of failing a strict load: they are a function of ``init_seed`` alone."""
        key = f"{prefix}fixed_bases"
        if self._has_fixed_buffer() and key not in state_dict:
            state_dict[key] = self.fixed_bases
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def _fixed_bases(self, d: int) -> Tensor:
        """The "fixed" bases (S, d, r): the buffer, or (d unknown at construction) the seeded
        draw for this d."""
        if not self._has_fixed_buffer():
            return self._seeded_bases(d)
        if self.fixed_bases.shape[1] != d:
            raise ValueError(
                f"{type(self).__name__}: the fixed bases have d={self.fixed_bases.shape[1]}, "
                f"the input gives d={d}; feed inputs with the channels it was built for."
            )
        return self.fixed_bases

    def _seeded_bases(self, d: int) -> Tensor:
        """(S, d, r) bases from ``sample_bases`` under the CPU generator seeded with
        ``init_seed``, L2-normalised over d; the global RNG state is restored afterwards."""
        with torch.random.fork_rng(devices=[]):
            torch.random.default_generator.manual_seed(self.init_seed)
            bases = self.sample_bases((self.groups, d, self.rank), like=torch.empty(0))
        return F.normalize(bases, dim=1, eps=self.norm_eps)

    def _updates_online_bases(self) -> bool:
        if "online" not in (self.init_mode, self.eval_init_mode):
            return False
        return self.online_update == "always" or (self.online_update == "train") == self.training

    def _register_online_bases(self) -> None:
        if self.channels is None or not self.spatial:
            raise ValueError(
                f"{type(self).__name__}: 'online' init keeps bases of a fixed size d = C/S, so "
                "it needs channels=C and spatial=True; pass channels or use 'random' or 'fixed'."
            )
        shape = (self.groups, self.channels // self.groups, self.rank)
        bases = self.sample_bases(shape, like=torch.empty(0))
        self.register_buffer("bases", F.normalize(bases, dim=1, eps=self.norm_eps))

    def _update_online_bases(self, bases: Tensor) -> None:
        """``D <- normalize_d(D + eta * (mean_batch(D_K) - D))`` without autograd."""
        with torch.no_grad():
            mean = bases.detach().reshape(-1, *self.bases.shape).mean(dim=0)
            moved = self.bases + self.eta * (mean.to(self.bases.dtype) - self.bases)
            self.bases.copy_(F.normalize(moved, dim=1, eps=self.norm_eps))
