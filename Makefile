# Two entry points (see README): `make lab` sets up and opens JupyterLab; `make test` sets up and runs every test.
# The environment lives in .venv/; set-up is redone only when pyproject.toml or constraints.txt changes.
# Python 3.11, 3.12 or 3.13: the first found of python3.11, python3.12, python3.13, python3 (or PYTHON=/path/to/python).
PYTHON ?= $(firstword $(foreach p,python3.11 python3.12 python3.13 python3,$(shell command -v $(p) 2>/dev/null)))
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The exact, tested set (pyproject.toml has the ranges); `make setup CONSTRAINTS=` installs the newest in range.
CONSTRAINTS ?= constraints.txt

.PHONY: setup lab test docs browser deepspeed-ops clean

setup: $(STAMP)

$(STAMP): pyproject.toml $(CONSTRAINTS)
	@test -n "$(PYTHON)" || { echo "error: no python3 found; install Python 3.11, 3.12 or 3.13, or run make PYTHON=/path/to/python3"; exit 2; }
	@$(PYTHON) -c 'import sys; v = sys.version_info[:2]; sys.exit(0 if (3, 11) <= v <= (3, 13) else print(f"error: $(PYTHON) is Python {v[0]}.{v[1]}; Python 3.11, 3.12 or 3.13 is needed: make PYTHON=/path/to/python3.13") or 2)'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# The CPU wheel of torch first where the platform has one (an unpinned torch would pull a multi-GB CUDA build).
	$(PY) -m pip install --quiet torch==2.13.0 $(if $(CONSTRAINTS),-c $(CONSTRAINTS))
	$(PY) -m pip install --quiet -e '.[lab,test]' $(if $(CONSTRAINTS),-c $(CONSTRAINTS))
	$(PY) -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (oom casebook)" >/dev/null
	touch $(STAMP)

# DeepSpeed's C++ Adam ops, built ahead (minutes, once; skipped with a note where no compiler exists: the notebooks
# then take DeepSpeed's torch_adam path). `python -m helpers.deepspeed_ops build --record` writes the times to
# data/results/deepspeed_op_builds.json; this target records nothing (no tracked file changes).
deepspeed-ops: $(STAMP)
	-$(PY) -m helpers.deepspeed_ops build

lab: $(STAMP) deepspeed-ops
	$(VENV)/bin/jupyter lab $(if $(filter 0,$(shell id -u)),--allow-root,) notebooks/

# Every notebook is executed once, by nbmake, on a copy in $(EXECUTED) (outputs written there, never into notebooks/);
# `make docs` then converts those copies. data/ is linked beside them, so the notebooks' ../data paths still resolve.
EXECUTED := build/executed
# Test files are shared among TEST_WORKERS processes (pytest-xdist), a whole file to each (its module fixtures, the
# browser test's JupyterLab among them, stay in one process), in the order collected: the browser test, the longest
# file, starts third instead of last. TEST_WORKERS=0 runs them in this one. The 25 slowest tests are listed at the end.
TEST_WORKERS ?= 2

test: $(STAMP) browser
	rm -rf $(EXECUTED) && mkdir -p $(EXECUTED)/notebooks && ln -s ../../data $(EXECUTED)/data
	cp notebooks/[0-9][0-9]_*.ipynb $(EXECUTED)/notebooks/
	$(PY) -m pytest tests $(EXECUTED)/notebooks --nbmake --nbmake-kernel=python3 --overwrite \
	  -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=25

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
