# Set-up, tests and the default training run.
# `make install` pins torch so that this machine takes its local CPU build; on a
# GPU machine the same pin resolves to PyPI's CUDA build. Override with TORCH=...
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
BIN := $(VENV)/bin
CONFIG ?= configs/multi30k_en_fr.yaml

.PHONY: install test check train clean

install:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "$(TORCH)"
	$(BIN)/pip install --quiet -e ".[dev]"

test:
	$(BIN)/pytest

check:
	$(BIN)/ruff check nmt tests scripts
	$(BIN)/ruff format --check nmt tests scripts
	$(BIN)/mypy

train:
	$(BIN)/nmt train $(CONFIG)

clean:
	rm -rf runs .pytest_cache .mypy_cache .ruff_cache
