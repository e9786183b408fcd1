# The two commands of the README: `make test` (set up, then pass every test, notebooks included)
# and `make lab` (set up, then open the tutorials in JupyterLab).
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin

.PHONY: setup setup-lab setup-bench test lab bench notebooks clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.test-stamp: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e ".[test]"
	touch $@

$(VENV)/.lab-stamp: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e ".[test,lab]"
	touch $@

setup: $(VENV)/.test-stamp
setup-lab: $(VENV)/.lab-stamp

test: setup
	$(BIN)/python -m pytest -q tests tutorials --nbval --nbval-current-env \
		--nbval-sanitize-with tests/nbval_sanitize.cfg -p no:cacheprovider

lab: setup-lab
	$(BIN)/jupyter lab tutorials/

# Benchmarks: tessera against NumPy and whichever peers are installed (make setup-bench adds
# PyTorch for the CPU and JAX). Ratios are printed and written to benchmarks/results/.
bench: setup
	$(BIN)/python -m benchmarks.bench $(BENCH_ARGS)

setup-bench: setup
	$(BIN)/python -m pip install -q pandas "jax[cpu]"
	$(BIN)/python -m pip install -q torch --index-url https://download.pytorch.org/whl/cpu \
		|| $(BIN)/python -m pip install -q torch

clean:
	rm -rf $(VENV) build *.egg-info

# Re-execute the tutorials in place (after changing them or the compiler's printed forms).
notebooks: setup
	for nb in tutorials/*.ipynb; do \
		$(BIN)/jupyter nbconvert --to notebook --execute --inplace "$$nb" || exit 1; done
