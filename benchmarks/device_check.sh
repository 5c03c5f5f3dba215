#!/usr/bin/env bash
# headscope on a CUDA GPU in under 5 minutes: the bundled models' scores on CUDA (float32 and
# bfloat16) against the CPU, scan/bare with synchronised timing at 2k and 8k (SmolLM2) and up to
# 32k (Gemma 3), and peak CUDA memory. Writes OUT/device_check.json and OUT/device_check.md
# (OUT defaults to build/device-check). Run from a checkout after `make demo` has set up .venv:
#
#     bash benchmarks/device_check.sh [--out DIR]
#
# A CUDA build of torch is needed (the CPU pin in constraints.txt is for the CPU machines):
#     .venv/bin/pip install --force-reinstall --no-deps torch==<the same version, CUDA build>
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec timeout 290 "$PYTHON" benchmarks/device_check.py "$@"
