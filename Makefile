# Set-up and entry points. `make test` and `make demo` create .venv when missing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install test demo study lint bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install torch==2.13.0
	$(PY) -m pip install -e '.[dev]'
	touch $(STAMP)

test: install
	$(PY) -m ruff check implicit_ham experiments tests
	$(PY) -m pytest -q

demo: install
	$(PY) -m experiments.train -m +experiment=demo
	$(PY) -m experiments.report multirun/demo --title "make demo: backward modes on legend_seg"
	@echo "report: multirun/demo/report.md (plots beside it; per-job results.json and metrics in multirun/demo/<n>/)"

study: install
	PY=$(PY) bash experiments/study.sh
	@echo "results: docs/results.md (figures in docs/results/; runs in multirun/study/)"

lint: install
	$(PY) -m ruff check implicit_ham experiments tests

bench: install
	$(PY) -m experiments.bench_adjoints
	$(PY) -m experiments.bench

clean:
	rm -rf $(VENV) outputs multirun wandb
