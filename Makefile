# Two commands: `make demo` and `make test`. Both create .venv and install the package into it.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# pytest workers: the exhaustive tests are split into chunks that xdist spreads over the cores.
JOBS   ?= $(shell nproc 2>/dev/null || echo 2)

.PHONY: demo test test-fast test-zoo bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)

# torch, pinned first to a CPU build (PyPI's default torch wheel on Linux is a multi-GB CUDA build; the
# emulator runs torch on the CPU only); then the package with the extras the test suite uses
TORCH  ?= torch==2.13.0
$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q '$(TORCH)'
	$(PY) -m pip install -q -e '.[test,dask,torch,msprobe]'
	touch $(STAMP)

# the demo's own kernel signatures (ascend_emu/data/demo_signatures.json) compiled first, split over the cores:
# a first demo is mostly Numba compiling (ascend_emu/tools/warmup.py). A failure only costs time.
DEMO_WARM := $(VENV)/.warmed-demo
$(DEMO_WARM): $(STAMP) $(wildcard kernels/*.py kernels/cube/*.py) ascend_emu/data/demo_signatures.json
	$(PY) -m ascend_emu.tools.warmup --demo --jobs $(JOBS) || echo "kernel warm-up failed: the kernels compile on first use"
	touch $(DEMO_WARM)

demo: $(DEMO_WARM)
	$(VENV)/bin/ascend-emu demo

# one Numba thread per pytest worker: JOBS workers already fill the cores, and parallel kernels on an
# oversubscribed machine wait on each other (measured: 27% faster on the training and fusion tests).
# ASCEND_EMU_REQUIRE_MSPROBE: the real `msprobe compare` tests fail, not skip, when msprobe or torch is missing
TESTENV := NUMBA_NUM_THREADS=1 ASCEND_EMU_REQUIRE_MSPROBE=1

# the kernels' type signatures (ascend_emu/data/kernel_signatures.json) compiled into Numba's cache once, split
# over the cores: otherwise every pytest worker compiles the same kernels at the start (ascend_emu/tools/warmup.py).
# A failure only costs time: the kernels then compile on first use.
WARM := $(VENV)/.warmed
$(WARM): $(STAMP) $(wildcard kernels/*.py kernels/cube/*.py) ascend_emu/data/kernel_signatures.json
	$(PY) -m ascend_emu.tools.warmup --jobs $(JOBS) || echo "kernel warm-up failed: the kernels compile on first use"
	touch $(WARM)

test: $(WARM)
	$(TESTENV) $(PY) -m pytest -n $(JOBS) -p no:cacheprovider -q -m "not zoo" --durations=40

# keras-hub for the zoo's BERT and GPT-2 backbones (not in `make test`: it brings ~260 MB of tensorflow-text)
HUB_STAMP := $(VENV)/.installed-hub
$(HUB_STAMP): $(STAMP)
	$(PY) -m pip install -q -e '.[test,hub]'
	touch $(HUB_STAMP)

# every keras.applications model and the other zoo cases (long: the largest models take minutes each)
test-zoo: $(HUB_STAMP)
	$(TESTENV) $(PY) -m pytest -n $(JOBS) -p no:cacheprovider -q -m zoo

# everything but the 2^32 sweeps and the big-model tests, for quick iteration
test-fast: $(STAMP)
	$(TESTENV) $(PY) -m pytest -n $(JOBS) -p no:cacheprovider -q -m "not exhaustive and not models and not zoo"

bench: $(STAMP)
	$(PY) -m benchmarks

clean:
	rm -rf $(VENV) build *.egg-info demo-output
	find . -name __pycache__ -prune -exec rm -rf {} +
