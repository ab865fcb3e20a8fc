#!/usr/bin/env bash
# The legend_seg stress test of docs/results.md (`make study-stress`; the page states its measured
# time; study v4, the page's first section, is `make study`). Sweeps run
# 2 jobs x 1 thread (joblib); the no-training studies and the benchmark run one at a time. A
# failed step is reported and the study goes on: the document lists what is missing.
set -uo pipefail
PY=${PY:-.venv/bin/python}
OUT=${OUT:-multirun/study}
STUDY=("study.ks=[1,3,6,12,24]" study.reference_steps=500 study.max_steps=60)
run() { "$@" || echo "study.sh: FAILED (exit $?): $*" >&2; }
# The report states this invocation's wall-clock from these two stamps (runs only).
mkdir -p "$OUT" && date +%s > "$OUT/.started"
# Q1: decomposition x backward mode at K = 6 x 3 seeds (36 jobs); Q3: baselines; Q2: remedies.
run $PY -m experiments.train -m +experiment=adjoint_ablation hydra.sweep.dir=$OUT/adjoints
run $PY -m experiments.train -m +experiment=attention_vs_md hydra.sweep.dir=$OUT/context
run $PY -m experiments.train -m +experiment=study_remedy hydra.sweep.dir=$OUT/remedy
# Argmin hams (docs/optimization_layers.md): nmf_ridge, cd_ridge x implicit / one_step / unroll.
run $PY -m experiments.train -m +experiment=study_ridge hydra.sweep.dir=$OUT/ridge
# The dD/dX probe on legend_seg: the one-step through the last step's bases (9 jobs).
run $PY -m experiments.train -m +experiment=legend_probe hydra.sweep.dir=$OUT/legend_probe
# Q2 and Q4 at initialisation, then on the BPTT-trained K=6 seed-0 model of each ham.
for ham in nmf vq cd nmf_normalized; do
  run $PY -m experiments.grad_study context=$ham "${STUDY[@]}" hydra.run.dir=$OUT/grad/init_$ham
done
for ham in nmf vq cd; do
  run $PY -m experiments.convergence context=$ham "${STUDY[@]}" \
    hydra.run.dir=$OUT/convergence/init_$ham
  job=$($PY -m experiments.find_job $OUT/adjoints context=$ham adjoint=unroll context.steps=6 \
    seed=0) || continue
  run $PY -m experiments.grad_study context=$ham checkpoint=$job/checkpoint.pt "${STUDY[@]}" \
    hydra.run.dir=$OUT/grad/trained_$ham
  run $PY -m experiments.convergence context=$ham checkpoint=$job/checkpoint.pt "${STUDY[@]}" \
    hydra.run.dir=$OUT/convergence/trained_$ham
done
# Q3's compute table: the context modules alone at the study's size (91 channels, 16x16) and 64x64.
run $PY -m experiments.bench --sizes 16 64 --channels 91 --rank 8 --modules nmf vq cd \
  self_attention sdpa_attention --sweep-steps --threads 1 --clock cpu --json $OUT/bench.json
date +%s > "$OUT/.finished"
$PY -m experiments.report --study $OUT --out docs
# Study v4's section and findings, from its committed CSV (at the top of both files).
$PY -m experiments.studies.paper_v4.report --csv docs/results/paper_v4.csv --out docs
