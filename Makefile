# Every target creates .venv when missing and installs PyTorch (pinned CPU wheel) before the package.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
TORCH  := torch==2.13.0

.PHONY: demo test bench lint install install-dev clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

# Stamps re-run the install when pyproject.toml changes.
$(VENV)/.installed: pyproject.toml | $(PY)
	$(PIP) install --quiet $(TORCH)
	$(PIP) install --quiet -e ".[data]"
	touch $@

$(VENV)/.installed-dev: pyproject.toml | $(PY)
	$(PIP) install --quiet $(TORCH)
	$(PIP) install --quiet -e ".[dev]"
	touch $@ $(VENV)/.installed

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

demo: $(VENV)/.installed
	$(PY) -m lmforge.demo --out runs/demo

lint: $(VENV)/.installed-dev
	$(VENV)/bin/ruff check src tests benchmarks

test: lint
	$(PY) -m pytest -q

bench: $(VENV)/.installed-dev
	$(PY) benchmarks/run_all.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache build src/*.egg-info
