# One task runner; .ci/run calls `make test`, exactly as the README's Quickstart does.
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
export HF_HUB_OFFLINE = 1
export HF_DATASETS_OFFLINE = 1

.PHONY: setup test lint kb bench clean

# torch is pinned to the CPU wheel on this machine's disk; an unpinned torch resolves to a multi-GB CUDA build.
$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[measure,dev]'
	touch $@

setup: $(BIN)/.installed

test: setup
	$(BIN)/ruff check advisor measure tests bench
	$(BIN)/python -m pytest

lint: setup
	$(BIN)/ruff check advisor measure tests bench
	$(BIN)/ruff format --check advisor measure tests bench

kb: setup
	$(BIN)/advisor kb build

bench: setup
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/python bench/recommend_latency.py
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/python bench/large_kb.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
