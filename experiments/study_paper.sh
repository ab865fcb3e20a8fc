#!/usr/bin/env bash
# The paper-regime part of the study (called by experiments/study.sh; about 30 min on 2 CPU
# cores alone): pretrain the digit_seg backbone once, then the fine-tuned sweep (every arm),
# the frozen-backbone subset and the AdamW check, 2 jobs x 1 thread. Finished jobs are skipped.
set -uo pipefail
PY=${PY:-.venv/bin/python}
OUT=$(realpath -m "${OUT:-multirun/study}")  # absolute: the artefact path is part of each job's config
PRETRAINED=model.pretrained=$OUT/pretrain/backbone.pt
run() { "$@" || echo "study_paper.sh: FAILED (exit $?): $*" >&2; }
run $PY -m experiments.pretrain --out "$OUT/pretrain/backbone.pt"
for part in finetune frozen adamw; do
  run $PY -m experiments.train -m +experiment=paper_$part "$PRETRAINED" \
    hydra.sweep.dir="$OUT/paper_$part"
done
