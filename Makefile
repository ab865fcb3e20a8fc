# Set-up and entry points. `make test` and `make demo` create .venv when missing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install test quick lint typecheck docs-build docs demo study study-stress bench bench-sequence benchmarks-public gpu-check generate deq-study clean

install: $(STAMP)

# torch first (the CPU build), so that the project's torch>=2.6 is already met and pip does not
# fetch a CUDA build; then the library with every extra (experiments, docs, dev tools).
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install torch==2.13.0
	$(PY) -m pip install -e '.[dev]'
	touch $(STAMP)

# Two worker processes (pytest-xdist), each test file in one of them (module fixtures are built
# once); TEST_WORKERS=0 runs them in this process.
TEST_WORKERS ?= 2
test: lint typecheck docs-build
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile

# The library's tests alone (tests/lib: no experiments, no subprocess sweeps), a few minutes.
quick: install
	$(PY) -m pytest -q tests/lib

lint: install
	$(PY) -m ruff check implicit_ham experiments tests

typecheck: install
	$(PY) -m mypy

docs-build: install
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --quiet

docs: install
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs serve

demo: install
	$(PY) -m experiments.train -m +experiment=demo
	$(PY) -m experiments.report multirun/demo --title "make demo: backward modes on legend_seg"
	@echo "report: multirun/demo/report.md (plots beside it; per-job results.json and metrics in multirun/demo/<n>/)"

# Study v4 (docs/results.md's first section, experiments/studies/paper_v4): the paper's one-step
# claim at its own settings; resumable, rows committed as jobs end; the page states its budget.
study: install
	OMP_NUM_THREADS=1 $(PY) -m experiments.studies.paper_v4.run multirun/study/paper_v4 --csv docs/results/paper_v4.csv --workers 2
	$(PY) -m experiments.studies.paper_v4.report --csv docs/results/paper_v4.csv --out docs

# The legend_seg stress test (docs/results.md after study v4: conditioning, convergence, the hams
# against attention), from its sweeps; the page states its measured time.
study-stress: install
	PY=$(PY) bash experiments/scripts/study.sh
	@echo "results: docs/results.md (figures in docs/results/; runs in multirun/study/)"

# Generation v3 (docs/generation_v3.md, experiments/studies/generation_v3): the masked-cell model
# of far-twin canvases trained through the engine; the pilot gate (no context vs self-attention,
# 3 seeds), the page, then (only if the gate passed: else `main` exits non-zero) 6 arms x 6 seeds
# (the pilot's jobs reused), two jobs at a time, one thread each, then the page. Resumable:
# finished jobs are rows of GEN_RESULTS (commit it) and are skipped; a stopped job resumes from
# its checkpoints in GEN_DIR. Measured on 2 idle cores, two workers: seed 0 of the six arms took
# 186 s wall (344 s of job time, the NMF implicit job 162 s of it), so the 36 main jobs take
# about 19 min. Then the pairing check: every arm's real-vs-recombined classifier over 8 seeds
# (48 jobs of 7680 steps, rows in GEN_PAIRING): 28 of them ran in 50 min wall on nearly idle
# cores; each arm's fastest job projects the 48 to 134 job minutes, about 67 min wall. The page's
# Compute section gives the projection from the rows.
GEN_DIR ?= multirun/generation_v3
GEN_RESULTS ?= docs/generation_v3/results.jsonl
GEN_PAIRING ?= docs/generation_v3/pairing.jsonl
generate: install
	OMP_NUM_THREADS=1 nice -n 10 $(PY) -m experiments.studies.generation_v3.run pilot $(GEN_DIR) --results $(GEN_RESULTS)
	$(PY) -m experiments.studies.generation_v3.report --results $(GEN_RESULTS) --pairing-results $(GEN_PAIRING)
	OMP_NUM_THREADS=1 nice -n 10 $(PY) -m experiments.studies.generation_v3.run main $(GEN_DIR) --results $(GEN_RESULTS)
	$(PY) -m experiments.studies.generation_v3.report --results $(GEN_RESULTS) --pairing-results $(GEN_PAIRING)
	OMP_NUM_THREADS=1 nice -n 10 $(PY) -m experiments.studies.generation_v3.run pairing $(GEN_DIR) --results $(GEN_PAIRING)
	$(PY) -m experiments.studies.generation_v3.report --results $(GEN_RESULTS) --pairing-results $(GEN_PAIRING)

# The DEQ training study of docs/deq_training.md: 5 arms x 3 seeds, two jobs at a time, one
# thread each, each job's row appended to docs/deq_training/runs.csv as it ends (commit it;
# resumable: jobs with a row are skipped), then the page from that CSV alone. Measured on this
# 2-core host at load average 7-8 (one job at a time, one thread, nice 5): seed 0 of the 5 arms
# took 232 s of job time (none 70, jacobian 33, spectral 38, correction 67, combined 24), so the
# 15 jobs take about 12 min at one worker; two workers help only on idle cores.
deq-study: install
	OMP_NUM_THREADS=1 $(PY) -m experiments.studies.deq_training.run multirun/deq_training --csv docs/deq_training/runs.csv --workers 2
	$(PY) -m experiments.report --deq docs/deq_training/runs.csv

# Runs both benchmark scripts and rewrites the tables of docs/benchmarks.md (~30 min on 2 cores).
bench: install
	$(PY) -m experiments.bench page

# The public benchmarks of docs/benchmarks_public.md (H3 synthetics, MNIST-1D): every job of
# experiments/studies/sequence_benchmarks/plan.py through the engine, two at a time, one thread
# each, rows committed to the CSV as jobs end (resumable: run it again to continue), then the
# page. `python -m experiments.studies.sequence_benchmarks.run --cost` prints the projection per
# priority tier (the whole plan does not fit 120 minutes; the top tiers do).
# PUBLIC_PLAN: the plan's options (--arm-seconds, --sanity-epochs, --mnist-epochs, --benchmarks,
# --tiers), given to both. PUBLIC_RUN: the runner's own, e.g. --stop-after-minutes 120.
PUBLIC_PLAN ?=
PUBLIC_RUN ?=
benchmarks-public: install
	OMP_NUM_THREADS=1 $(PY) -m experiments.studies.sequence_benchmarks.run multirun/sequence_benchmarks --csv docs/benchmarks_public/runs.csv --workers 2 $(PUBLIC_PLAN) $(PUBLIC_RUN)
	$(PY) -m experiments.studies.sequence_benchmarks.report --csv docs/benchmarks_public/runs.csv --out docs/benchmarks_public.md $(PUBLIC_PLAN)

# Token mixers against the sequence length, docs/benchmarks_sequence.md (~3 min on one thread).
bench-sequence: install
	OMP_NUM_THREADS=1 $(PY) -m experiments.bench sequence --json docs/benchmarks_sequence/cost.json --page docs/benchmarks_sequence.md

# The CUDA checks of docs/benchmarks_gpu.md (under 8 min on one GPU); without CUDA it says so and
# exits 0. Never part of `make test`.
gpu-check: install
	$(PY) -m experiments.gpu_check

clean:
	rm -rf $(VENV) outputs multirun wandb site
