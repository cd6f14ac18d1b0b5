# fusion_nb: the two commands of the README, and the steps behind them.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PROFILE ?= tiny
export PATH := $(abspath $(BIN)):$(PATH)

.PHONY: setup reproduce test test-fast export clean-nbs docs

setup: $(VENV)/.installed

# torch goes in first, pinned to 2.13.0: with it installed, pip never pulls the CUDA build.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[dev,ray]"
	touch $@

reproduce: setup
	$(BIN)/fusion-nb reproduce --profile $(PROFILE)

test: setup
	bash .ci/check_clean.sh
	HF_HUB_OFFLINE=1 $(BIN)/pytest -q tests
	HF_HUB_OFFLINE=1 $(BIN)/nbdev-test --n-workers 2

export: setup
	$(BIN)/nbdev-export && $(BIN)/nbdev-clean

# The docs site (every library, method and experiment notebook, rendered by nbdev and Quarto) into _docs/.
# Quarto is a binary outside PyPI: `pip install quarto-cli` only downloads it from GitHub while it builds.
docs: setup
	@command -v quarto >/dev/null 2>&1 || { echo "make docs needs Quarto on PATH (https://quarto.org/docs/download/, or" \
	  "'$(BIN)/pip install quarto-cli' where GitHub is reachable)"; exit 2; }
	$(BIN)/nbdev-docs --n-workers 1
