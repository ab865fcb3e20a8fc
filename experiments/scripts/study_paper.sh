#!/usr/bin/env bash
# The paper-regime part of the study (called by experiments/scripts/study.sh; 16.5 min on 2 idle CPU
# cores): pretrain the digit_seg backbone once, then the fine-tuned sweep (every arm), the
# frozen-backbone subset and the AdamW check, 2 jobs x 1 thread, then the task-loss gradient
# studies. Finished jobs are skipped.
set -uo pipefail
PY=${PY:-.venv/bin/python}
# absolute: the artefact path is part of every job config, so it must not depend on the cwd
OUT=$(realpath -m "${OUT:-multirun/study}")
PRETRAINED=model.pretrained=$OUT/pretrain/backbone.pt
run() { "$@" || echo "study_paper.sh: FAILED (exit $?): $*" >&2; }
run $PY -m experiments.pretrain --out "$OUT/pretrain/backbone.pt"
for part in finetune frozen adamw; do
  run $PY -m experiments.train -m +experiment=paper_$part "$PRETRAINED" \
    hydra.sweep.dir="$OUT/paper_$part"
done
# Task-loss gradients of the trained arms' modes, at initialisation and on the BPTT-trained
# seed-0 model of each ham (fine-tuned regime).
STUDY=("study.ks=[1,3,6,12,24]" study.reference_steps=500)
for ham in nmf vq cd; do
  run $PY -m experiments.grad_study +experiment=paper_finetune +arm=${ham}_unroll "$PRETRAINED" \
    "${STUDY[@]}" hydra.run.dir="$OUT/grad_paper/init_$ham"
  job=$($PY -m experiments.find_job "$OUT/paper_finetune" arm=${ham}_unroll seed=0) || continue
  run $PY -m experiments.grad_study +experiment=paper_finetune +arm=${ham}_unroll "$PRETRAINED" \
    checkpoint="$job/checkpoint.pt" "${STUDY[@]}" hydra.run.dir="$OUT/grad_paper/trained_$ham"
done
