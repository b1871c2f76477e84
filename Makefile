# The commands of the README: `make demo` (the quickstart notebook, end to end, 2 CPU workers), `make test` (every
# test) and `make test-fast` (the tests that start nothing). Both set up .venv themselves; torch comes from the local 2.13.0 wheel when present.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_VERSION ?= 2.13.0

LAB_PORT ?= 8888
LAB_ARGS ?=

XLA_VENV ?= .venv-xla
XLA_TORCH_VERSION ?= 2.9.0

.PHONY: demo test test-fast test-xla bench lab clean system-deps

$(VENV)/.ready: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "torch==$(TORCH_VERSION)"
	$(BIN)/pip install -q -e '.[test]'
	touch $@

demo: $(VENV)/.ready
	$(BIN)/python scripts/run_notebook.py notebooks/quickstart.ipynb

system-deps:
	bash scripts/install_system_deps.sh

test: $(VENV)/.ready system-deps
	$(BIN)/ruff check .
	$(BIN)/lint-imports --no-cache
	$(BIN)/python -m pytest -q -p no:cacheprovider

# The loop while editing: every test marked `fast`, i.e. none of the costs of tests/helpers/costs.py (no worker,
# kernel, sshd, Slurm, browser or npm started).
test-fast: $(VENV)/.ready
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -p no:cacheprovider -m fast

# device="xla" on the real torch_xla, on PJRT's CPU device with 2 devices (tests/xla). A venv of its own: torch and
# torch-xla of one version from PyPI (about 7 GB), and what the tests need; the package itself from this checkout.
$(XLA_VENV)/.ready:
	$(PYTHON) -m venv $(XLA_VENV)
	$(XLA_VENV)/bin/pip install -q --upgrade pip
	$(XLA_VENV)/bin/pip install -q "torch==$(XLA_TORCH_VERSION)" "torch-xla==$(XLA_TORCH_VERSION)"
	$(XLA_VENV)/bin/pip install -q cloudpickle ipython ipykernel ipywidgets pyyaml numpy psutil pytest pytest-timeout \
		nbclient nbformat jupyter_client
	touch $@

test-xla: $(XLA_VENV)/.ready
	NOTEBOOK_LAUNCHER_TEST_XLA=1 PJRT_DEVICE=CPU CPU_NUM_DEVICES=2 PYTHONPATH=$(CURDIR) \
		$(XLA_VENV)/bin/python -m pytest -q -p no:cacheprovider tests/xla tests/test_torch_internals.py

# JupyterLab on notebooks/ (127.0.0.1:$(LAB_PORT)), to see the live panel: open the URL it prints, run a notebook.
lab: $(VENV)/.ready
	$(BIN)/jupyter lab --ServerApp.root_dir=notebooks --ServerApp.ip=127.0.0.1 --ServerApp.port=$(LAB_PORT) \
		$(if $(filter 0,$(shell id -u)),--allow-root,) $(LAB_ARGS)

# Every benchmark, one after another (benchmarks/run.py); `make bench B=launch_overhead` (or B="a b") for some.
bench: $(VENV)/.ready
	$(BIN)/python benchmarks/run.py $(B)

clean:
	rm -rf $(VENV) $(XLA_VENV) notebooks/*.executed.ipynb
