# tokenspeed_lit: every target sets itself up on a fresh clone (creates .venv, installs pinned deps).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# NOVENV=1: use the python3 on PATH as it is (a GPU machine with torch, triton and nbdev already installed and no
# package index), e.g. `make bench NOVENV=1`, `make demo NOVENV=1` (that python needs transformers too)
PY = $(BIN)/python
ifdef NOVENV
BIN := $(patsubst %/,%,$(dir $(shell command -v python3)))
PY := $(shell command -v python3)
STAMP :=
endif
# Without CUDA every Triton kernel runs on CPU tensors through the interpreter.
NOGPU = $$($(PY) -c 'import torch; print(int(not torch.cuda.is_available()))')
# bench/ (the benchmarks, not installed) is imported from the repository root by the notebooks that run them;
# tools/site holds a sitecustomize that spares Triton's CPU interpreter its repeated patching (only where
# TRITON_INTERPRET=1; its docstring says why); HF_HUB_OFFLINE=1: the demo's transformers model is built from a config,
# nothing may be fetched; Python writes each module's bytecode cache where it first imports it (the setup writes most).
RUN = unset PYTHONDONTWRITEBYTECODE; export TRITON_INTERPRET=$${TRITON_INTERPRET:-$(NOGPU)}; export PYTHONUNBUFFERED=1; export HF_HUB_OFFLINE=1; export PYTHONPATH=$(CURDIR)/tools/site:$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH};

.PHONY: help install test check-export nbtest pytest test-gpu sanitize demo bench readme docs docs-serve outputs clean

help:
	@echo "make test     - export/clean checks, every notebook as a test, pytest tests/ (CPU ok)"
	@echo "make demo     - the serving-loop demo on a transformers Llama, checked against transformers every step"
	@echo "make demo RANKS=2 DEMO_ARGS=\"--model hybrid\" - the demo's options go in DEMO_ARGS (RANKS=N: data-parallel ranks); DEMO_ARGS=--help lists them"
	@echo "make demo DEMO_ARGS=\"--tp 2\" - tensor-parallel: each data-parallel rank is 2 processes over gloo (NCCL on GPUs), each holding half the Llama's heads (RANKS x 2 processes)"
	@echo "make install  - only the one-time setup every target does first: $(VENV) with requirements-dev.txt (about 2.8 GB)"
	@echo "make test-gpu - GPU: every notebook and every pytest test but the docs site's, in parallel (NOVENV=1: no venv)"
	@echo "make sanitize - GPU: the kernel tests under compute-sanitizer memcheck"
	@echo "make bench    - GPU benchmarks side by side in one run, then the Performance page (NOVENV=1: no venv)"
	@echo "make readme   - README.md from nbs/index.ipynb"
	@echo "make docs     - the documentation site from the notebooks, offline, into docs/_site"
	@echo "make docs-serve - build it and serve it on http://localhost:$(PORT)/ (search needs a server: browsers block it from file://)"
	@echo "make outputs NBS=\"...\" - execute notebooks and save their outputs in place (FLAGS=gpu: the GPU-only cells too)"
	@echo "make clean    - remove $(VENV), the docs build and test artifacts"

# Shared libraries the Mooncake wheel (the L3 tier) loads: installed with apt-get where missing (CI runs as root).
L3_DEBS := libibverbs1 libnuma1 librdmacm1

# The first run of any target (make demo included) says what it sets up, once, before it does (pip -q prints nothing
# while it works): 2.8 GB is the size of the venv on a CPU machine (torch 2.13.0+cpu), measured with du -sh; about 60 s
# is the install on a 2-core machine with pip's cache warm.
$(STAMP): requirements-dev.txt settings.ini setup.py
	@echo "one-time setup (once, before the first run): $(VENV) with the pinned packages of requirements-dev.txt and this package (torch, triton, transformers, nbdev, Sphinx, Playwright, Mooncake): about 2.8 GB on disk on a CPU machine, downloaded unless pip has them cached, about 60 s on 2 cores; then every make target starts at once"
	@missing=$$(command -v dpkg >/dev/null && for d in $(L3_DEBS); do dpkg -s $$d >/dev/null 2>&1 || echo $$d; done); \
	if [ -n "$$missing" ]; then \
	  if command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
	    apt-get -o DPkg::Lock::Timeout=600 update -qq && apt-get -o DPkg::Lock::Timeout=600 install -y -qq $$missing; \
	  else echo "warning: the L3 tests need the Debian packages $$missing (apt-get install them as root)"; fi; fi
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q --no-compile -r requirements-dev.txt
	$(PY) -m pip install -q --no-compile --no-deps -e .
	@# bytecode for what the tests import, written by importing it once, in two processes (2,600 of the venv's 13,500
	@# files: 12 s on 2 cores, where compiling every file took 45 s); the rest is written where a test first imports it (RUN)
	env -u PYTHONDONTWRITEBYTECODE $(PY) -c 'import tokenspeed_lit.demo.cli, tokenspeed_lit.l3.tier; from transformers import LlamaForCausalLM, Qwen3_5ForCausalLM' & \
	env -u PYTHONDONTWRITEBYTECODE $(PY) -c 'import hypothesis, pytest, xdist, execnb.nbio, nbdev, IPython, matplotlib.pyplot' && wait $$!
	touch $@

install: $(STAMP)

# nbdev_export and nbdev_clean must be no-ops: the package and the notebooks agree and are committed clean.
check-export: $(STAMP)
	@$(PY) tools/check_noop.py -- $(BIN)/nbdev_export
	@$(PY) tools/check_noop.py -- $(PY) tools/export_bench.py
	@$(PY) tools/check_noop.py -- $(BIN)/nbdev_clean
	@$(PY) tools/check_noop.py -- $(BIN)/nbdev_clean --fname bench
	@$(PY) tools/check_noop.py -- $(PY) tools/nb2md.py --no-quarto nbs/index.ipynb README.md

# The Mooncake client (L3 notebooks) logs in glog's format straight to file descriptor 2, which the notebook runner
# does not capture: those lines are dropped from the output; everything else on stderr (a failing notebook's
# traceback) still shows.
GLOG_LINE := '^[IWEF][0-9]{4} [0-9:.]+ +[0-9]+ [^ ]+:[0-9]+\]|^WARNING: Logging before InitGoogleLogging'
# Without a GPU, one intra-op thread per notebook process, as the demo's notebooks and tests/conftest.py set for
# theirs: nbtest runs beside pytest (`make test`), and torch's threads waiting for each other on busy cores cost more
# than they compute.
ONE_THREAD = if [ "$$TRITON_INTERPRET" = 1 ]; then export OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1}; fi;
nbtest: $(STAMP)
	@$(RUN) $(ONE_THREAD) time $(BIN)/nbdev_test --n_workers 2 --timing 2> >(grep -vE $(GLOG_LINE) >&2)
	@$(RUN) $(ONE_THREAD) time $(BIN)/nbdev_test --path bench --n_workers 2 --timing 2> >(grep -vE $(GLOG_LINE) >&2)

# One pytest-xdist worker more than there are cores, a test file per worker (its servers and the docs site built once
# per file): the L3, demo and docs tests wait on servers, deadlines and subprocesses for part of their time, and the
# extra worker runs while they wait (on 2 cores, `make test` warm: pytest 398 s with 2 workers, 346 s with 3; the cores
# busy 92% and 97% of the run).
pytest: $(STAMP)
	@$(RUN) $(PY) -m pytest -q -n $$(( $$(nproc) + 1 )) --dist loadfile --durations=15 tests/

# The notebooks and pytest side by side once the export checks pass (on a 2-core machine each leaves cores idle while
# its servers, deadlines and subprocesses wait); each one's output is printed whole when it ends.
test: check-export
	@$(MAKE) --no-print-directory -j2 --output-sync=target nbtest pytest

# GPU: every notebook and every pytest test that does not need the docs toolchain, 8 workers (pytest-xdist), and the
# kernel tests under compute-sanitizer memcheck; both record their counts in bench/results/gpu_suite.json.
test-gpu: $(STAMP)
	@$(RUN) $(PY) tools/gpu_suite.py

sanitize: $(STAMP)
	@$(RUN) $(PY) tools/gpu_suite.py --sanitize

demo: $(STAMP)
	@$(RUN) $(PY) -m tokenspeed_lit.demo --ranks $(or $(RANKS),1) $(DEMO_ARGS)

# GPU: every benchmark side by side in one run (tables to bench/results/*.json), then the Performance page.
bench: $(STAMP)
	@$(RUN) $(PY) tools/run_nbs.py --flags gpu nbs/core/01_driver.ipynb \
	  nbs/staging/10_positions.ipynb nbs/staging/11_padding.ipynb nbs/staging/12_page_tables.ipynb \
	  nbs/staging/15_fused_decode.ipynb nbs/staging/16_input_buffers.ipynb nbs/tiers/22_host_mirror.ipynb nbs/tiers/21_host_transport.ipynb
	@$(RUN) $(PY) bench/l3.py
	@$(RUN) $(PY) tools/run_nbs.py nbs/91_performance.ipynb

readme: $(STAMP)
	@$(PY) tools/nb2md.py nbs/index.ipynb README.md

# nbdev's processing + Sphinx/myst-nb (Quarto cannot be installed offline): see tools/build_docs.py.
docs: $(STAMP)
	@$(RUN) $(PY) tools/build_docs.py $(DOCS_ARGS)

PORT ?= 8000
docs-serve: docs
	$(PY) -m http.server $(PORT) --bind 127.0.0.1 -d docs/_site

# Execute notebooks and save their outputs in place (FLAGS=gpu also runs the GPU-only cells).
outputs: $(STAMP)
	@$(RUN) $(PY) tools/run_nbs.py --flags "$(FLAGS)" $(NBS)

clean:
	rm -rf $(VENV) _proc docs/_site docs/_build test-artifacts
