"""A shared artefact is built once: two real processes ask for the generation metrics'
classifier cache at the same time; one builds it (its training replaced by an untrained network
and a second's sleep, so that the other certainly arrives meanwhile: the lock is under test,
not the training) while the other waits on the build lock, then loads it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = textwrap.dedent(
    """
    import logging, sys, time
    logging.basicConfig(level=logging.INFO)
    import experiments.generation.classifier as c
    cache, marker = sys.argv[1], sys.argv[2]
    def counted(*args, **kwargs):
        with open(marker, "a") as fh:
            fh.write("trained\\n")
        time.sleep(1.0)
        return c.HalfDigitClassifier(), 0.5
    c.train_classifier = counted
    open(marker + ".ready", "a").close()
    _, accuracy = c.load_or_train_classifier(cache, 1, 0.2, 0)
    print(f"accuracy={accuracy!r}")
    """
)


def test_two_jobs_build_the_classifier_cache_once(tmp_path: Path) -> None:
    cache, marker = tmp_path / "classifier.pt", tmp_path / "trained"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen([sys.executable, "-c", SCRIPT, str(cache), str(marker)], cwd=ROOT,
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]  # fmt: skip
    outputs = [proc.communicate(timeout=300) for proc in procs]
    for proc, (_, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err[-2000:]
    assert marker.read_text() == "trained\n"  # one build for the two jobs
    accuracies = [out.strip().splitlines()[-1] for out, _ in outputs]
    assert accuracies == ["accuracy=0.5", "accuracy=0.5"]  # the one built, loaded by the other
    assert cache.exists()
    waited = [err for _, err in outputs if "is being built by pid" in err]
    assert len(waited) <= 1  # the other process either waited or started after the build
