"""Weights & Biases sink. ``wandb`` is imported only when this sink is created.

Mode: an explicit ``mode`` wins; otherwise ``WANDB_MODE`` from the environment is respected;
otherwise, when ``WANDB_API_KEY`` is unset, the run is ``"offline"`` (written under
``dir/wandb/offline-run-*``; upload later with ``wandb sync``), so nothing ever blocks on the
network or a login prompt. Pass ``mode="online"`` to use credentials stored by ``wandb login``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from experiments.engine.file_sinks import safe_name
from implicit_ham.diagnostics import Sink, plain_metrics

WandbMode = Literal["online", "offline", "disabled", "shared"]
WANDB_MODES: tuple[WandbMode, ...] = ("online", "offline", "disabled", "shared")


def resolve_mode(mode: str | None) -> WandbMode | None:
    """The wandb mode to pass to ``wandb.init`` (None: let wandb read ``WANDB_MODE``); an
    unknown ``mode`` raises before wandb starts."""
    if mode is not None:
        for known in WANDB_MODES:
            if mode == known:
                return known
        raise ValueError(
            f"wandb mode {mode!r}: must be one of {', '.join(WANDB_MODES)} (or null: chosen "
            "from the environment); e.g. logger.mode=offline on the command line"
        )
    if os.environ.get("WANDB_MODE"):
        return None
    return None if os.environ.get("WANDB_API_KEY") else "offline"


def resolved_config(config: Any) -> dict[str, Any]:
    """A plain dict of ``config``: an OmegaConf/Hydra config is resolved (interpolations
    evaluated) into containers; a mapping is copied; None gives {}."""
    if config is None:
        return {}
    from omegaconf import OmegaConf

    if OmegaConf.is_config(config):
        return OmegaConf.to_container(config, resolve=True)  # type: ignore[return-value]
    if isinstance(config, Mapping):
        return dict(config)
    raise TypeError(f"config must be a mapping or an OmegaConf config, got {type(config).__name__}")


class WandbSink(Sink):
    """Logs to a wandb run.

    Args:
        project: wandb project. group: run group (e.g. a sweep's name). tags: run tags.
        config: the full configuration (a dict or a Hydra/OmegaConf config, resolved).
        dir: directory under which wandb writes ``wandb/`` (default: the current directory).
        mode: "online", "offline" or "disabled"; None chooses as the module docstring says.
    """

    def __init__(
        self,
        project: str,
        *,
        group: str | None = None,
        tags: Sequence[str] = (),
        config: Any = None,
        dir: str | Path | None = None,
        mode: str | None = None,
    ) -> None:
        import wandb

        self._wandb = wandb
        if dir is not None:
            Path(dir).mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(
            project=project,
            group=group,
            tags=list(tags),
            config=resolved_config(config),
            dir=None if dir is None else str(dir),
            mode=resolve_mode(mode),
            reinit="create_new",
        )

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        self.run.log(plain_metrics(metrics), step=step)

    def log_table(
        self, name: str, rows: Sequence[Mapping[str, Any]], step: int | None = None
    ) -> None:
        plain = [plain_metrics(r) for r in rows]
        columns = list(dict.fromkeys(k for r in plain for k in r))
        table = self._wandb.Table(
            columns=[*columns], data=[[r.get(c) for c in columns] for r in plain]
        )
        self.run.log({safe_name(name): table}, step=step)  # step None: wandb's own step

    def close(self) -> None:
        """Finish the run. wandb's service process writes the offline run file
        (``run-*.wandb``) asynchronously: it may complete a moment after this returns."""
        self.run.finish()
