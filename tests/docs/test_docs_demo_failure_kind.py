"""docs/experiments.md names the failure kind the demo's implicit arm logs (issue 26 item 9: the
page named the wrong kind). The arm is run here, on a tiny legend_seg, with the demo's own
preset and arm: every training step's backward is an event of the kind the page names, once per
pass (its GMRES misses there are warning events, not failure events of the other kind the page
names)."""

from __future__ import annotations

import re
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir

from experiments.config.groups import TrainConfig, register_configs
from experiments.config.typed import typed_config
from experiments.engine.run import run_training

ROOT = Path(__file__).resolve().parents[2]
TINY = ["epochs=1", "data.train_size=16", "data.val_size=8", "batch_size=8",
        "diagnostics.enabled=false"]  # fmt: skip


def test_the_page_names_the_kind_the_demos_implicit_arm_logs(tmp_path: Path) -> None:
    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["+experiment=demo", "+arm=nmf_implicit", *TINY])
    threads = torch.get_num_threads()
    try:
        results = run_training(typed_config(cfg, TrainConfig), tmp_path / "job")
    finally:
        torch.set_num_threads(threads)
    by_kind = results["failures"]["by_kind"]
    page = (ROOT / "docs" / "experiments.md").read_text()
    named = re.search(r"logged as an\s+event of kind `(\w+)` \(one per training step", page)
    assert named, "docs/experiments.md no longer names the implicit arm's failure kind"
    steps = 16 // 8
    assert by_kind.get(named.group(1)) == steps, (named.group(1), by_kind)
    # one event per backward pass: the GMRES misses at that point are not a second kind
    at_fixed_point = r"and\s+`(\w+)`\s+is\s+a\s+miss\s+at\s+a\s+point\s+that\s+is\s+a\s+fixed"
    other = re.search(at_fixed_point, page)
    assert other and other.group(1) != named.group(1)
    assert not by_kind.get(other.group(1)), by_kind
