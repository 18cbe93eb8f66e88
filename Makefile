# One entry point for humans and CI. Everything installs into .venv; torch is pinned first
# because an unpinned torch requirement pulls a multi-GB CUDA build.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
TORCH  := torch==2.13.0

.PHONY: install test demo lint typecheck bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q $(TORCH)
	$(BIN)/pip install -q -e '.[models,dev]'
	touch $(STAMP)

install: $(STAMP)

test: install
	$(BIN)/pytest -q

lint: install
	$(BIN)/ruff check release gates tests examples benchmarks

typecheck: install
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .relctl build *.egg-info
