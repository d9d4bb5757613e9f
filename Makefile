# xf: the two commands of the README are `make demo` and `make test`.
#
# TORCH is the torch requirement installed before xf. The default pins the CPU build, which is
# what a CPU-only machine needs; on a GPU machine use the build you want, e.g.
#   make test TORCH='torch>=2.4'    (keeps an installed CUDA torch, or pulls one from PyPI)
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.xf-installed

.PHONY: venv test test-fast demo bench docs clean bergamot

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH)"
	$(BIN)/python -m pip install --quiet -e ".[test]"
	touch $(STAMP)

venv: $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest -q tests

# the tests not marked slow (no model trained, no process started): about a minute
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow" tests

# docs/options.md, generated from the options classes (tests/test_docs.py fails when it is stale)
docs: $(STAMP)
	$(BIN)/python -c "from xformer_cli.cli import options_reference; print(options_reference(), end='')" > docs/options.md

demo: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" bash recipes/quickstart.sh

bench: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python bench/run.py

# Bergamot's WebAssembly engine for xf export bergamot, pinned (the version its files are tested with)
bergamot:
	npm install --prefix .bergamot --no-save --no-audit --no-fund @browsermt/bergamot-translator@0.4.9

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .bergamot
