#!/usr/bin/env bash
# Sets everything up, then runs the tests: fast unit tests first, then end-to-end, then the real model.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/python -m pytest "$@"
