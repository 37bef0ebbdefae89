# Two entry points (see README): `make lab` sets up and opens JupyterLab; `make test` sets up and runs every test.
# The environment lives in .venv/; set-up is redone only when pyproject.toml changes.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup lab test docs browser clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found; install Python 3.11 or run make PYTHON=/path/to/python3.11"; exit 2; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# The CPU wheel of torch first: an unpinned torch would pull a multi-GB CUDA build.
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e .
	$(PY) -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (oom casebook)" >/dev/null
	touch $(STAMP)

lab: $(STAMP)
	$(VENV)/bin/jupyter lab $(if $(filter 0,$(shell id -u)),--allow-root,) notebooks/

# Every notebook is executed once, by nbmake, on a copy in $(EXECUTED) (outputs written there, never into notebooks/);
# `make docs` then converts those copies. data/ is linked beside them, so the notebooks' ../data paths still resolve.
EXECUTED := build/executed

test: $(STAMP) browser
	rm -rf $(EXECUTED) && mkdir -p $(EXECUTED)/notebooks && ln -s ../../data $(EXECUTED)/data
	cp notebooks/[0-9][0-9]_*.ipynb $(EXECUTED)/notebooks/
	$(PY) -m pytest tests $(EXECUTED)/notebooks --nbmake --nbmake-kernel=python3 --overwrite

# The browser test drives Debian's chromium with Playwright (never `playwright install`: no browser download).
browser:
	@command -v chromium >/dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    (apt-get install -y -q chromium >/dev/null 2>&1 || (apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null)); \
	  else echo "note: install Debian's chromium (sudo apt-get install chromium) to run the browser test; it skips without it"; fi; }

# Executed notebooks as static HTML (figures as pictures), with an index in notebook order: docs/index.html.
# Converts the copies `make test` executed when they are newer than the sources; executes the others.
docs: $(STAMP)
	$(PY) -m helpers.docs --out docs

clean:
	rm -rf $(VENV)
