#!/usr/bin/env bash
# Sets everything up on a fresh machine: a virtual environment in .venv/ with specedit and its tools.
# Idempotent: a second run only checks. Needs Python >= 3.10 with venv; reaches PyPI only.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
pip() { .venv/bin/python -m pip --disable-pip-version-check -q "$@"; }

# torch first and pinned: a bare `torch` requirement pulls a multi-GB CUDA build; 2.13.0 is the CPU wheel
# this machine carries. specedit itself accepts any recent torch, so a GPU user's CUDA build stays.
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
    pip install "torch==${SPECEDIT_TORCH_VERSION:-2.13.0}"
fi
pip install -e ".[dev,cluster]"
echo "specedit is set up: $(pwd)/.venv/bin/specedit" >&2
