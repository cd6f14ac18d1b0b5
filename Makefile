# fusion_nb: the two commands of the README, and the steps behind them.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PROFILE ?= tiny
export PATH := $(abspath $(BIN)):$(PATH)

.PHONY: setup reproduce pins test test-all test-other-cpu test-fast export clean-nbs docs lab

setup: $(VENV)/.installed

# torch goes in first, pinned to 2.13.0, by pip (which reads the machine's pip configuration: its local wheels and
# indexes give the CPU build); with it installed, nothing later pulls the CUDA build. The rest (about 150 packages) goes
# in with uv, which downloads and unpacks in parallel (pip does it where uv cannot be had): 12 s with a warm cache, 57 s
# cold, against pip's ~210 s on this 2-core machine (2026-12-02, the same versions resolved). uv writes no .pyc files;
# Python writes them for the modules a process imports, once — unless PYTHONDONTWRITEBYTECODE is set (this machine sets
# it), which made every process compile transformers, datasets and mlflow again (a CI run had reached a quarter of pytest
# after 19 minutes). So make's commands run without it (`unexport` below): measured on a fresh venv, importing the
# package, transformers, datasets and mlflow took 28-31 s a process with it set, 26 s the first time without it and 16 s
# after (3 jobs on 2 cores); uv's --compile-bytecode, which compiles every module of every package at install, added 61 s
# to setup instead.
unexport PYTHONDONTWRITEBYTECODE
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q uv && $(BIN)/uv pip install -q --python $(BIN)/python -e ".[dev,ray,docs]" \
	  || $(BIN)/pip install -q -e ".[dev,ray,docs]"
	touch $@

reproduce: setup
	$(BIN)/fusion-nb reproduce --profile $(PROFILE)

# Tests run one worker per core (pytest-xdist), one torch thread each: most tests are single-threaded Python and
# subprocesses, so two workers on two cores take about half the time of one. FUSION_NB_JOBS=1: the runner's experiments
# run one at a time inside them (the workers already fill the cores; tests that run several at once say so). tests/conftest.py serialises the files that
# share a lazily built zoo (a lock per zoo), builds the micro benchmark once before the workers start, and orders the files longest
# first (--no-loadscope-reorder keeps that order: xdist would otherwise hand out the files with most tests first).
# The trained zoos every build copies instead of training (pins/, tracked): after a change to what a zoo is made of (its
# recipe: code, settings, budget), the runs below train the new zoos and keep them in pins/; commit it with the change.
pins: setup
	FUSION_NB_PIN=1 $(BIN)/fusion-nb reproduce --profile micro
	FUSION_NB_PIN=1 $(BIN)/fusion-nb reproduce --profile tiny

# `make test` leaves out the tests marked slow (pytest -m slow: paper profiles run end to end on the hub mirror, the robust
# experiments at paper scale, the docs site's build), which keep CI under 15 minutes; `make test-all` runs them too.
PYTEST_MARKS ?= not slow
# nbdev-test runs beside pytest, on one worker, not after it: pytest's two workers leave part of the two cores idle (they
# wait on kernels, servers and Ray), and nbdev-test on its own ran its longest notebooks (nbs/tiny/, last in its order)
# while one of its workers waited. The micro benchmark is built (or restored from pins/) before either starts, so that
# they never build it at once; the zoos they share take a lock per folder (fusion_nb.core.cached_builds). nbdev-test's
# output is printed after pytest's. Examples that merge are not tracked (FUSION_NB_TRACK=0, as tests/conftest.py).
test: setup
	bash .ci/check_clean.sh
	HF_HUB_OFFLINE=1 $(BIN)/python -c "from fusion_nb.tiny.build import micro_pool; micro_pool()"
	@log=$$(mktemp); set -x; \
	HF_HUB_OFFLINE=1 FUSION_NB_TRACK=0 OMP_NUM_THREADS=1 $(BIN)/nbdev-test --n-workers 1 --timing > $$log 2>&1 & notebooks=$$!; \
	HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 FUSION_NB_JOBS=1 $(BIN)/pytest -q -n auto --dist loadfile --no-loadscope-reorder --durations=25 -m "$(PYTEST_MARKS)" tests; \
	pytest_rc=$$?; wait $$notebooks; nbdev_rc=$$?; set +x; \
	echo "--- nbdev-test (ran beside pytest): exit $$nbdev_rc ---"; cat $$log; rm -f $$log; \
	exit $$(( pytest_rc || nbdev_rc ))

# The same tests as another CPU computes them: torch's kernels capped below this CPU's (AVX-512 → AVX2, AVX2 → AVX, else the portable
# ones; .ci/other_cpu.py). Training here then rounds differently from the machine that trained pins/, so a test that
# compares a training run of this machine with the pinned bytes fails here. Run it before a stop that touches training,
# a zoo's recipe or pins/ (issue 55).
test-all: PYTEST_MARKS = slow or not slow
test-all: test

test-other-cpu: setup
	$(BIN)/python .ci/other_cpu.py $(MAKE) test

# Read and run the notebooks: JupyterLab (the optional extra `lab`) installed into .venv once, then opened on nbs/.
# Its kernel is .venv's Python 3 (the notebooks' kernelspec, python3), so a notebook imports this checkout's fusion_nb;
# tests/test_lab.py starts that kernel and runs an experiment's first cells. LAB_ARGS: e.g. --no-browser --port 8890.
LAB_ARGS ?=
lab: $(VENV)/.lab-installed
	$(BIN)/jupyter lab --notebook-dir=nbs $(LAB_ARGS)

$(VENV)/.lab-installed: $(VENV)/.installed
	$(BIN)/pip install -q -e ".[dev,ray,docs,lab]"
	touch $@

export: setup
	$(BIN)/nbdev-export && $(BIN)/nbdev-clean

# The docs site (every library, method and experiment notebook) into _docs/: nbdev-docs with Quarto when Quarto is
# on PATH, else Sphinx + myst-nb (fusion_nb.site) on the same notebooks processed by nbdev. Quarto is a binary outside
# PyPI (`pip install quarto-cli` only downloads it from GitHub while it builds). Experiment pages show the executed
# runs of outputs/$(DOCS_PROFILE)/ (default: tiny, else micro), written by `make reproduce`.
DOCS_PROFILE ?=
docs: setup
	@if command -v quarto >/dev/null 2>&1; then \
	  echo "make docs: rendering with Quarto (nbdev-docs)"; $(BIN)/nbdev-docs --n-workers 1; \
	else \
	  echo "make docs: Quarto is not on PATH; rendering with Sphinx + myst-nb (fusion_nb.site)"; \
	  $(BIN)/python -c 'from fusion_nb.site import main; main()' $(if $(DOCS_PROFILE),--profile $(DOCS_PROFILE)); \
	fi
	@echo "make docs: open _docs/index.html, or serve it: $(BIN)/python -m http.server -d _docs 8000"
