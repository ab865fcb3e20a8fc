"""A sweep job's results checked against its own record of what it trained (issue 47 item 7).

* ``results.json`` records the metric files it was written with (``logs``,
  ``experiments.engine.log_record``); when they changed since (a later run in the directory,
  e.g. ``reliability.resume=false`` with other settings, rewrote them and did not finish), the
  ok results are ``stale``: not reported.
* ``results.json``'s ``config`` is what the job trained; Hydra's ``.hydra/config.yaml`` and
  ``overrides.yaml`` are rewritten by every later command in the directory, a refused one
  included. Where they differ, the job is labelled by the config it trained (each differing key
  an override names takes the trained value); where an override cannot be mapped to a config
  value (a config group such as ``adjoint=unroll``), the job is ``mislabelled``: not reported.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from experiments.engine.log_record import logs_mismatch
from experiments.engine.resume import comparable_config, config_differences
from experiments.reports.render import Table

if TYPE_CHECKING:
    from experiments.reports.sweep_jobs import Job


def flat_config(
    config: Mapping[str, Any], prefix: str = "", skip: Sequence[str] = ()
) -> dict[str, str]:
    """``config`` as ``{dotted key: str(value)}``, without the top-level keys in ``skip``."""
    out: dict[str, str] = {}
    for key, value in config.items():
        if not prefix and key in skip:
            continue
        if isinstance(value, Mapping):
            out.update(flat_config(value, f"{prefix}{key}.", skip))
        else:
            out[f"{prefix}{key}"] = str(value)
    return out


def read_config(path: Path) -> dict[str, Any]:
    """Hydra's saved job config with its interpolations resolved ({} when absent or when an
    interpolation cannot be resolved outside the job): where a results.json without a
    ``config`` falls back to."""
    if not path.exists():
        return {}
    try:
        config = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    except OmegaConfBaseException:
        return {}
    return {str(k): v for k, v in config.items()} if isinstance(config, dict) else {}


def check_own_record(job: Job) -> None:
    """Check an ok job's results against the files beside them (module docstring): the logs
    they were written with (``results.json``'s ``logs``) and the config Hydra recorded for the
    job's last launch (``.hydra/config.yaml``, with ``overrides.yaml``)."""
    logs = job.record.get("logs")
    changed = logs_mismatch(job.directory, logs) if isinstance(logs, Mapping) else None
    if changed:
        job.status = "stale"
        job.error = (
            f"results.json says ok, but the metric files beside it changed after it was written "
            f"({changed}): a later run in this directory (e.g. reliability.resume=false) rewrote "
            "them and did not finish. Its results are not reported; run the job's command again "
            "to finish it."
        )
        return
    trained = job.record.get("config")
    launched = read_config(job.directory / ".hydra" / "config.yaml")
    if not isinstance(trained, Mapping) or not launched:
        return
    differ = config_differences(comparable_config(launched), comparable_config(trained))
    if not differ:
        return
    flat, hydra = flat_config(trained, skip=()), flat_config(launched, skip=())
    said = ", ".join(f"{k}={hydra.get(k, '(unset)')}" for k in differ)
    was = ", ".join(f"{k}={flat.get(k, '(unset)')}" for k in differ)
    if all(k in job.overrides and k in flat for k in differ):
        for key in differ:
            job.overrides[key] = flat[key]
        job.notes.append(
            f"relabelled: .hydra/ says {said} (a later command rewrote it), results.json's "
            f"config says the job trained with {was}; reported under the latter"
        )
        return
    job.status = "mislabelled"
    job.error = (
        f"results.json's config (what the job trained: {was}) differs from .hydra/ ({said}, "
        "a later command rewrote it) in values its overrides do not name, so its arm is "
        "unknown; not reported. Run the job's command again in a fresh directory."
    )


def relabelled_jobs(jobs: Sequence[Job]) -> Table:
    """The jobs whose results were checked against their own record and relabelled or set
    aside (``Job.notes``; an empty table when none)."""
    return Table.of(
        ["job", "what the check found"],
        [[job.directory.name, note] for job in jobs for note in job.notes],
    )
