# The README's two commands: `make run` (main job on the embedded default) and `make test`.
VENV := .venv
KMESH := $(VENV)/bin/kmesh
PYTEST := $(VENV)/bin/pytest
PROFILE ?= cpu
SECTIONS ?= 00
# pytest-xdist: one worker per core, a test file (its module-scoped engines) or a golden notebook (its cells in
# order) on one worker; in collection order, so the goldens go first (tests reading their runs wait for them,
# tests/conftest.py smoke_run). TEST_WORKERS=0 runs in this process.
TEST_WORKERS ?= $(shell nproc 2>/dev/null || echo 2)
XDIST := -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder
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
	$(PYTEST) -m "not gpu" -rs tests $(NBVAL) $(XDIST) -p no:cacheprovider

test-lib: env
	$(PYTEST) -m "not gpu" -rs tests --ignore=tests/golden $(XDIST)

test-notebooks: env
	$(PYTEST) -rs tests/golden $(NBVAL) $(XDIST)

goldens: env
	$(VENV)/bin/python scripts/make_goldens.py

bench: env
	for b in benchmarks/bench_*.py; do $(VENV)/bin/python $$b || exit 1; done

index: env
	$(KMESH) index

# Local runs (runs/, ignored by git). Published runs live in outputs/ and are never touched here.
clean-runs:
	rm -rf runs/
