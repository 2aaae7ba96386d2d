#!/usr/bin/env bash
# Installs aider (a real OpenAI-API client no one here wrote) for the end-to-end test of the HTTP door
# (tests/test_real_model.py): `aider-chat` pins its dependencies exactly, so it gets a virtual environment
# of its own, build/aider-venv (ignored by git; about 700 MB, 1-3 minutes from PyPI). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
AIDER_VERSION=0.86.2
VENV=build/aider-venv
if [ -x "$VENV/bin/aider" ] && [ "$("$VENV/bin/aider" --version 2>/dev/null)" = "aider $AIDER_VERSION" ]; then
    exit 0
fi
PYTHON="${PYTHON:-python3}"
"$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip --disable-pip-version-check -q install "aider-chat==$AIDER_VERSION"
echo "aider is set up: $VENV/bin/aider" >&2
