# The two commands of the README: `make test` (set up, then pass every test, the tutorials and
# the worked models in notebooks/ included)
# and `make lab` (set up, then open the tutorials in JupyterLab).
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin

.PHONY: setup setup-lab setup-bench test test-clang lab bench notebooks clean gpu-check graphviz fuzz sweep

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.test-stamp: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e ".[test]"
	touch $@

$(VENV)/.lab-stamp: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e ".[test,lab]"
	touch $@

setup: $(VENV)/.test-stamp $(VENV)/.torch-stamp
setup-lab: $(VENV)/.lab-stamp $(VENV)/.torch-stamp

# The tests and the notebooks nbval checks in TEST_WORKERS processes (pytest-xdist: each module,
# or notebook, runs whole in one process, which keeps a kernel cache of its own), then, alone,
# those that drive JupyterLab and Chromium (a browser's waits share a machine badly).
TEST_WORKERS ?= 2
test: setup
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadscope -p no:cacheprovider tests \
		tutorials notebooks --ignore=tests/lab --nbval --nbval-current-env \
		--nbval-sanitize-with tests/nbval_sanitize.cfg
	$(BIN)/python -m pytest -q -p no:cacheprovider tests/lab

# The same kernels built by clang instead of gcc (CI installs Debian's clang and libomp-dev): the
# operator, reduction, GEMM and attention tests. Without OpenMP, clang's kernels run on one
# thread, with one warning (Apple's clang).
CLANG ?= clang
test-clang: setup
	CC=$(CLANG) $(BIN)/python -m pytest -q -p no:cacheprovider tests/ops/test_elementwise.py \
		tests/ops/test_reductions.py tests/ops/test_integers.py tests/targets/test_gemm.py \
		tests/ops/test_attention.py \
		tests/targets/test_isa.py tests/targets/test_gemm_bf16.py

# The random-program fuzzer (tests/fuzz/fuzzer.py) for FUZZ_SECONDS (default an hour): fresh
# programs against float64 NumPy; each failure is printed and kept in tests/fuzz/regressions.json,
# which make test replays.
FUZZ_SECONDS ?= 3600
fuzz: setup
	$(BIN)/python tests/fuzz/fuzzer.py --seconds $(FUZZ_SECONDS)

# Tests run again and again on fresh random inputs (tests/sweep.py): each failure with the seeds
# that replay it. SWEEP names the tests (default: those that bound statistics of random draws).
SWEEP ?= tests/frontend/prob tests/ops/test_random.py tests/frontend/test_numerics.py
SWEEP_RUNS ?= 20
sweep: setup
	$(BIN)/python tests/sweep.py --runs $(SWEEP_RUNS) $(SWEEP)

# Graphviz's dot draws the explorer's graphs (tighter than the pure-Python layout used without
# it): installed from Debian's packages when missing and make runs as root; else said, with the
# command.
graphviz:
	@if command -v dot >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "make: installing Graphviz (apt-get install graphviz)"; \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq graphviz >/dev/null \
		|| (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq graphviz >/dev/null) \
		|| echo "make: apt-get could not install graphviz; graphs are drawn by the pure-Python layout"; \
	else echo "make: Graphviz's dot is missing, so graphs are drawn by the pure-Python layout;" \
		"for Graphviz's: sudo apt-get install graphviz (brew install graphviz on a Mac)"; fi

# JupyterLab refuses to start as root (a container's user) without --allow-root: passed then.
# It serves the whole project (tutorials/ and the worked models in notebooks/), opening on the
# tutorials.
lab: setup-lab graphviz
	$(BIN)/jupyter lab $(if $(filter 0,$(shell id -u)),--allow-root) \
		--ServerApp.root_dir=$(CURDIR) --LabApp.default_url=/lab/tree/tutorials

# For a machine with an NVIDIA GPU: CuPy, then the device tests (every operator and fused
# strategy against NumPy, each program run twice for bitwise determinism) and the GPU
# benchmarks, whose table lands in benchmarks/results/. GPU_PYTHON=python3 runs them with an
# interpreter that already has CuPy, NumPy and pytest (a machine without network), this tree
# on its path, instead of the virtual environment.
GPU_TESTS = tests/targets/test_gpu_device.py tests/targets/test_gpu_routines.py tests/dist/test_gpu.py
ifdef GPU_PYTHON
gpu-check:
	PYTHONPATH=$(CURDIR) $(GPU_PYTHON) -m pytest -q -p no:cacheprovider -m gpu $(GPU_TESTS)
	PYTHONPATH=$(CURDIR) $(GPU_PYTHON) -m benchmarks.bench_gpu $(BENCH_ARGS)
else
gpu-check: setup
	$(BIN)/python -m pip install -q -e ".[test,cuda]"
	$(BIN)/python -m pytest -q -p no:cacheprovider -m gpu $(GPU_TESTS)
	$(BIN)/python -m benchmarks.bench_gpu $(BENCH_ARGS)
endif

# Benchmarks: tessera against NumPy and whichever peers are installed (make setup-bench adds
# PyTorch for the CPU and JAX). Ratios are printed and written to benchmarks/results/.
bench: setup
	$(BIN)/python -m benchmarks.bench $(BENCH_ARGS)
	$(BIN)/python -m benchmarks.bench_prob $(if $(findstring --quick,$(BENCH_ARGS)),--quick)
	$(BIN)/python -m benchmarks.bench_dist $(if $(findstring --quick,$(BENCH_ARGS)),--quick)
	$(BIN)/python -m benchmarks.bench_latency $(if $(findstring --quick,$(BENCH_ARGS)),--quick)
	$(BIN)/python -m benchmarks.bench_busy $(if $(findstring --quick,$(BENCH_ARGS)),--quick)
	$(BIN)/python -m benchmarks.bench_generate $(if $(findstring --quick,$(BENCH_ARGS)),--quick)

# PyTorch, which the interop tests check the bridges against (make test) and the benchmarks
# compare with (make bench): its CPU wheel (about 0.2 GB) rather than PyPI's default Linux wheel,
# which brings about 4 GB of CUDA libraries. PyTorch's CPU index first; where that cannot be
# reached, a +cpu wheel in pip's own find-links (installed alone, then its dependencies); PyPI's
# wheel only as a last resort. An installed torch is kept.
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
$(VENV)/.torch-stamp: | $(BIN)/python
	$(BIN)/python -c "import torch" 2>/dev/null \
		|| $(BIN)/python -m pip install -q --retries 1 --timeout 30 torch --index-url $(TORCH_INDEX) \
		|| ($(BIN)/python -m pip install -q --no-index --no-deps torch \
			&& $(BIN)/python -m pip install -q torch) \
		|| (echo "setup: no CPU wheel of torch found; installing PyPI's (with CUDA)" \
			&& $(BIN)/python -m pip install -q torch)
	touch $@

# The bench extra (JAX for the CPU, pandas), which the installed torch already satisfies.
setup-bench: setup
	$(BIN)/python -m pip install -q -e ".[bench]" "jax[cpu]"
	$(BIN)/python -c "import torch, jax; print('setup-bench: torch', torch.__version__, \
		'(a CUDA build: pip uninstall torch, then make setup-bench again, for the CPU wheel)' \
		if torch.version.cuda else '(CPU build)', '- jax', jax.__version__)"

clean:
	rm -rf $(VENV) build *.egg-info

# Re-execute the tutorials and the worked models in place (after changing them or the
# compiler's printed forms).
notebooks: setup
	$(BIN)/python tests/execute_notebooks.py tutorials/*.ipynb notebooks/*.ipynb
