# Two entry points on a fresh machine: `make tour` (the main job) and `make test`.
# Each creates .venv and installs what it needs. On a machine without an NVIDIA driver the CPU
# build of torch is taken through constraints/cpu.txt; with a driver, pip picks the CUDA build.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
CPU_CONSTRAINT := $(if $(shell command -v nvidia-smi 2>/dev/null),,-c constraints/cpu.txt)
# The extras the set-up installs. `make test` (and the targets that run it) adds `docs` to the same
# pip call on a fresh clone: one resolve and one editable build, not a second pip run for the docs.
EXTRAS ?= dev,hf,tensorboard,mlflow,lightning
test test-all test-under-load: EXTRAS := $(EXTRAS),docs

.PHONY: install tour lab lint test test-slow test-all test-under-load test-fast test-gpu gpu-check bench docs clean

$(VENV)/.installed: pyproject.toml constraints/cpu.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(CPU_CONSTRAINT) -e '.[$(EXTRAS)]'
	# tunekit.experiment's ipyexperiments without the deprecated `pynvml` package it requires
	# (its shim makes `import torch` warn); nvidia-ml-py, a tunekit dependency, provides pynvml
	$(PY) -m pip install -q --no-deps 'ipyexperiments>=0.1.29'
	$(PY) -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $@ $(if $(findstring docs,$(EXTRAS)),$(VENV)/.docs-installed)

install: $(VENV)/.installed

# The main job: execute the tour (profiling magic + dashboard on the built-in model) and write
# build/00_tour.ipynb and build/tour.html, a report that opens offline with every chart embedded.
tour: install
	mkdir -p build
	$(PY) -m jupyter nbconvert --to notebook --execute notebooks/00_tour.ipynb --output-dir build \
		--ExecutePreprocessor.timeout=600
	$(PY) -m tunekit.cli.report_html build/00_tour.ipynb build/tour.html
	@echo "open build/tour.html: summary, every chart and the dashboard, offline (or 'make lab')"

# Interactive: JupyterLab on the notebooks (installs jupyterlab on first use).
lab: install
	$(PY) -m pip install -q $(CPU_CONSTRAINT) jupyterlab
	$(VENV)/bin/jupyter lab $(if $(filter 0,$(shell id -u)),--allow-root,) notebooks/00_tour.ipynb

lint: install
	$(VENV)/bin/ruff check tunekit tests benchmarks notebooks tools

# Lint, the docs site built strictly, the unit tests but those marked `slow` (magics in a real IPython
# shell, notebook pairs in sync), and every notebook executed by nbval in a kernel: under 15 minutes
# from a fresh clone on 2 cores, install included. `make test-slow` runs the slow tests (each keeps a
# fast test of its behaviour in this run), `make test-all` both. The notebooks run beside the unit tests
# (two cores, two suites; each must hold on a busy machine anyway); their report follows the tests'.
# The notebooks' kernels get one OpenMP thread: two suites of two threads each on two cores made
# both crawl (21m40s in all, where one after the other took ~16 min).
# Chapter 19 submits to a real Slurm: where `tools/slurm_cluster.py check` passes (root, Debian's
# slurmctld/slurmd/munge), a one-node test cluster runs in build/slurm for the notebooks (SLURM_CONF
# in their environment only; the unit tests start their own) and is stopped at the end whatever
# happens (a trap on exit, Ctrl-C and TERM); elsewhere the chapter says so and shows its script.
test: lint docs
	@mkdir -p build
	@cluster=""; \
	if $(PY) tools/slurm_cluster.py check >/dev/null 2>&1; then \
	  trap '$(PY) tools/slurm_cluster.py down --dir build/slurm >/dev/null 2>&1' EXIT; trap 'exit 130' INT TERM; \
	  $(PY) tools/slurm_cluster.py down --dir build/slurm >/dev/null 2>&1; \
	  if $(PY) tools/slurm_cluster.py up --dir build/slurm --cpus 4 > build/slurm-up.log 2>&1; \
	  then cluster="SLURM_CONF=$$(pwd)/build/slurm/slurm.conf"; echo "test cluster up (build/slurm) for the notebooks"; \
	  else echo "the test cluster did not start (build/slurm-up.log): chapter 19 shows its script only"; fi; \
	else echo "no test cluster ($$($(PY) tools/slurm_cluster.py check)): chapter 19 shows its script only"; fi; \
	env $$cluster OMP_NUM_THREADS=1 $(PY) -m pytest -q --nbval-lax -p no:cacheprovider notebooks/*.ipynb > build/nbval.log 2>&1 & nb=$$!; \
	$(PY) -m pytest -q -m "not gpu and not slow" --durations=25 tests; tests=$$?; \
	wait $$nb; notebooks=$$?; echo "== notebooks (nbval)"; cat build/nbval.log; \
	exit $$(( tests != 0 || notebooks != 0 ))

# The tests marked `slow` (the first hour from a wheel, the longest docs pages, the dense Ctrl-C
# sweeps, wheels and subprocess runs, 8B plans, every real Slurm job but the one `make test` submits,
# the 2-node cluster, autotune sweeps on the cluster, SHARD_GRAD_OP's torchrun launch): ~20 minutes on
# 2 cores; they start their own Slurm test cluster where they need one. Each keeps a fast test of its
# behaviour in `make test`. CI may run them after `make test`; `make test-all` runs both, one after
# the other.
test-slow: install
	$(PY) -m pytest -q -m "slow and not gpu" --durations=25 tests

test-all: test test-slow

# `make test` beside two processes that keep both cores busy (tools/busy.py): tests must not
# depend on a quiet machine. busy.py stops its spinners when `make test` ends, whatever the
# result (its exit status is passed on), after 2 hours at most, and if it is killed itself.
test-under-load: install
	$(PY) tools/busy.py --cores 2 --seconds 7200 -- $(MAKE) --no-print-directory test

# The quick loop while editing: no slow tests, no notebooks.
test-fast: install
	$(PY) -m pytest -q -m "not gpu and not slow" tests

# On a CUDA machine (the device tool): GPU-only tests.
test-gpu: install
	$(PY) -m pytest -q -m gpu tests

# On a lent GPU (the device tool's image has torch, transformers, pandas, nvidia-ml-py and no package
# index, so nothing is installed): every GPU path against the device's own figures in under 8 minutes,
# written to $OUT (else build/gpu_check) as gpu_check.json and gpu_check.md (tools/gpu_check.py).
# GPU_CHECK_ARGS="--dry-run" runs it on the CPU, as `make test` does; "--only plan,lab" reruns sections.
GPU_PY := $(if $(wildcard $(PY)),$(PY),$(PYTHON))
gpu-check:
	$(GPU_PY) tools/gpu_check.py $(GPU_CHECK_ARGS)

# The docs site (mkdocs.yml): the pages in docs/, the API reference from the docstrings of every
# public name, the chapter notebooks as pages; built into build/site/ with --strict (a broken link
# or an API entry that does not resolve fails). Needs no network once the [docs] extra is in.
# `make test` builds it too (12 s of CPU; 15-30 s on 2 busy cores; tests/project/test_docs.py checks its
# structure in a few seconds without building).
$(VENV)/.docs-installed: $(VENV)/.installed pyproject.toml
	$(PY) -m pip install -q $(CPU_CONSTRAINT) -e '.[docs]'
	touch $@

docs: $(VENV)/.docs-installed
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet --site-dir build/site
	@echo "open build/site/index.html"

bench: install
	for b in benchmarks/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) build .pytest_cache
