# The two commands of the README, plus the slow tests and the benchmarks.
# Everything goes through scripts/setup.sh, which is idempotent.
VENV ?= .venv
# Python's bytecode cache is written (lazily, into .venv and the tree) even where the environment turns it
# off: without .pyc files every process compiles torch's and vLLM's sources again (importing vllm took
# 22 s instead of 6.6 s here, and a vLLM start imports it in three processes; the tests run many processes).
unexport PYTHONDONTWRITEBYTECODE
PY := $(VENV)/bin/python

.PHONY: setup demo lint test test-slow test-faults test-cluster bench
setup:
	bash scripts/setup.sh

# setup installs and compiles bytecode in the background (scripts/setup.sh); the demo prepares its model (Qwen; its
# index is BM25 only, no encoder) while it builds the index. Setup's seconds go to the demo's stage times.
demo:
	@t0=$$(date +%s); DYNRAG_MODELS=none DYNRAG_COMPILE=background bash scripts/setup.sh && \
	  DYNRAG_SETUP_S=$$(( $$(date +%s) - t0 )) $(VENV)/bin/dynrag demo

# ruff (lint, then the formatter's check) and mypy, configured in pyproject.toml; about 10 s
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# scripts/run_tests.py: pytest processes, as many at once as the machine has cores (TEST_JOBS=n to choose);
# CI (.ci/run) runs `make test TEST_MARKS="not slow"`: the tests, the Ray cluster tests and the fault-injection
# suite in one run
TEST_MARKS ?= not slow and not faults and not cluster
test: lint
	$(PY) scripts/run_tests.py -m "$(TEST_MARKS)"

test-slow: setup
	$(PY) scripts/run_tests.py -m slow

# the tests that start Ray in their process (multi-node clusters, Ray jobs): about four minutes on 2 cores
test-cluster: setup
	$(PY) scripts/run_tests.py -m "cluster and not slow and not faults"

test-faults: setup
	$(PY) scripts/run_tests.py -m "faults and not slow" tests/faults/test_*.py
