# Two entry points (see README): `make lab` sets up and opens JupyterLab; `make test` sets up and runs every test.
# The environment lives in .venv/; set-up is redone only when pyproject.toml changes.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup lab test clean

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

test: $(STAMP)
	$(PY) -m pytest tests $(if $(wildcard notebooks/*.ipynb),notebooks --nbmake --nbmake-kernel=python3,)

clean:
	rm -rf $(VENV)
