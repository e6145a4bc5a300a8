# Every target creates .venv when missing and installs PyTorch (pinned CPU wheel) before the package.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
TORCH  := torch==2.13.0

.PHONY: demo test bench lint install install-dev clean browser docs

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
	$(PY) -m lmforge demo --out runs/demo

lint: $(VENV)/.installed-dev
	$(VENV)/bin/ruff check src tests benchmarks

CHROMIUM_PKGS := chromium chromium-driver
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo -n)

# Headless Chromium for tests/viz/test_viewer_browser.py (skipped with a reason when it cannot be installed).
browser:
	@if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then \
		echo "installing $(CHROMIUM_PKGS) (Debian packages) for the HTML viewer tests"; \
		($(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq $(CHROMIUM_PKGS)) >/dev/null 2>&1 || \
		echo "could not install $(CHROMIUM_PKGS): the browser tests of the HTML viewer will be skipped"; \
	fi

test: lint browser
	$(PY) -m pytest -q

bench: $(VENV)/.installed-dev
	$(PY) benchmarks/run_all.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache build src/*.egg-info src/lmforge/embeddings/*.so

# The documentation site (MkDocs Material), built offline into site/; --strict fails on a broken link or warning.
docs: $(VENV)/.installed-dev
	$(PY) docs/gen_reference.py
	$(PY) -m mkdocs build --strict --quiet
