# Set-up, tests and the default training run.
# `make install` pins torch so that this machine takes its local CPU build; on a
# GPU machine the same pin resolves to PyPI's CUDA build. Override with TORCH=...
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
BIN := $(VENV)/bin
# `make train`: the everyday English->French model in a laptop's half hour (the benchmark
# recipe: make train CONFIG=configs/multi30k_en_fr.yaml MINUTES=120).
CONFIG ?= configs/general_en_fr.yaml
MINUTES ?= 30
# More of `nmt train`'s flags: ARGS=--resume continues the run (another MINUTES of it),
# ARGS=--overwrite starts it over; a second `make train` without either is refused.
ARGS ?=
BENCH_MINUTES ?= 2
# The data root (one folder per corpus): the shared one where it exists, else the config's
# own (data/, where missing corpora are downloaded). NMT_DATA_DIR=... make train overrides.
train: export NMT_DATA_DIR ?= $(if $(wildcard ../shared/data),$(abspath ../shared/data))

.PHONY: install install-browser test check train bench clean

install:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "$(TORCH)"
	$(BIN)/pip install --quiet -e ".[dev]"

# Headless Chromium (Debian's package) for the browser test of `nmt serve`'s page
# (tests/test_page.py, skipped without it).
install-browser:
	$(if $(filter 0,$(shell id -u)),,sudo) apt-get install -y --no-install-recommends chromium

# The suite in one process per core (pytest-xdist; a file's tests stay in one process, so
# its fixtures are made once), each process with its share of the cores' threads: 2 cores
# of the Xeon with AMX ran it in 828 s as one process, in 577 s as two of 2 threads each
# (threads spinning against each other), in 447 s as two of 1 thread each.
CORES := $(shell nproc 2>/dev/null || getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1)
TEST_WORKERS ?= $(shell echo $$(( $(CORES) < 4 ? $(CORES) : 4 )))
TEST_THREADS ?= $(shell echo $$(( $(CORES) / $(TEST_WORKERS) > 1 ? $(CORES) / $(TEST_WORKERS) : 1 )))
test:
	OMP_NUM_THREADS=$(TEST_THREADS) $(BIN)/pytest -n $(TEST_WORKERS) --dist loadfile

check:
	$(BIN)/ruff check nmt tests scripts
	$(BIN)/ruff format --check nmt tests scripts
	$(BIN)/mypy
	$(BIN)/python scripts/long_code.py --strict

train:
	$(BIN)/nmt train $(CONFIG) --set train.max_minutes=$(MINUTES) $(ARGS)

# nmt alone: the reference model's training tokens/s (fp32, and bf16 where the hardware has
# it; fp16 too on a GPU), greedy and beam-5 decoding of test_2016_flickr, peak memory.
# scripts/compare_peers.py runs the same with OpenNMT-py and Joey NMT beside it.
bench:
	$(BIN)/python scripts/compare_peers.py --only nmt-fp32,nmt-bf16,nmt-fp16 \
		--minutes $(BENCH_MINUTES) --out results/bench.json

# The tools' caches only: runs/ holds the models trained here (`make train`'s among them),
# which are the user's to delete.
clean:
	rm -rf .pytest_cache .mypy_cache .ruff_cache
