# The README's two commands: `make run` (main job on the embedded default) and `make test`.
VENV := .venv
KMESH := $(VENV)/bin/kmesh
PYTEST := $(VENV)/bin/pytest
PROFILE ?= cpu
SECTIONS ?= 00
NBVAL := --nbval-lax --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg --nbval-cell-timeout 1800

.PHONY: env run test lint test-lib test-notebooks goldens bench index clean-runs

env:
	bash scripts/setup_env.sh

run: env
	@for s in $(SECTIONS); do $(KMESH) run $$s --profile $(PROFILE) || exit 1; done

lint: env
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports

test: env lint
	$(PYTEST) -m "not gpu" -rs tests $(NBVAL) -p no:cacheprovider

test-lib: env
	$(PYTEST) -m "not gpu" -rs tests --ignore=tests/golden

test-notebooks: env
	$(PYTEST) -rs tests/golden $(NBVAL)

goldens: env
	$(VENV)/bin/python scripts/make_goldens.py

bench: env
	for b in benchmarks/bench_*.py; do $(VENV)/bin/python $$b || exit 1; done

index: env
	$(KMESH) index

# Local runs (runs/, ignored by git). Published runs live in outputs/ and are never touched here.
clean-runs:
	rm -rf runs/
